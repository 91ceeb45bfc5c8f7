//! TODO(helper): implement
