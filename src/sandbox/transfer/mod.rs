//! File transfer over the Engine API archive endpoints: tar streamed in and out, no exec, no
//! argv, no base64. Size, type and link target come from the archive stat (a HEAD request)
//! before any body is read, so refusals cost one round trip and never stream a large body.
//!
//! `entry` builds tar (headers, an archive's parts), `stat` reads the archive stat, `request`
//! holds what the requests share (extraction point, upload options, deadline); `read` takes the
//! file out of a download's archive, `download` locates and reads it, `upload` and `staged`
//! write files, `layout` writes the sandbox's directories and activity file.

mod download;
mod entry;
mod layout;
mod read;
mod request;
mod staged;
mod stat;
mod upload;

pub use download::download;
pub use entry::entry_header;
pub use layout::{make_layout, touch_activity};
pub use read::read_single_file;
pub use request::extract_point;
pub use staged::put_staged;
pub use stat::{special_kind, stat, PathStat};
pub use upload::{upload, MOUNTED_BY_ENGINE};
