//! Files as the sandbox user: uploads, downloads, stat and the layout (`ops`), large uploads
//! through the engine's archive endpoint (`staged`), and the path resolution both use
//! (`resolve`, which the Code Mode relay uses too to reach its socket's directory).

pub mod ops;
pub mod resolve;
pub mod staged;
