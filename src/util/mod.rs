//! Pieces every layer uses: the error type, ids, label keys, timestamps, logging.

pub mod errors;
pub mod ids;
pub mod labels;
pub mod logging;
pub mod timestamps;
