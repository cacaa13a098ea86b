//! import (in progress)
