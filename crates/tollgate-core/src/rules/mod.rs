//! Rules: to be written.
