//! Pieces every layer uses: the error type, ids, label keys, timestamps, logging, bounded maps.

pub mod bounded;
pub mod errors;
pub mod ids;
pub mod labels;
pub mod logging;
pub mod timestamps;
