//! Files: uploads (streamed, from memory, or staged for the engine's archive endpoint), downloads
//! (size first, then chunks), and the metadata requests `stat` and `layout`.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::conn::AgentClient;
use super::error::{outcome, ClientError};
use super::stream::{Inbound, Stream};
use crate::frame::MAX_DATA;
use crate::msg::{
  DownloadDone, DownloadHead, DownloadSpec, LayoutSpec, Request, StagedDone, StagedHead,
  StagedUploadSpec, StatInfo, StatSpec, UploadDone, UploadSpec,
};

/// A download in progress: its size up front, then its bytes in chunks.
pub struct Download {
  pub head: DownloadHead,
  stream: Stream,
  received: u64,
}

impl Download {
  /// The next chunk, or `None` once the whole file has arrived and the agent confirmed it
  /// did not change while it was read.
  pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
    loop {
      match self.stream.next().await? {
        Inbound::Data(b) => {
          self.received += b.len() as u64;
          if self.received > self.head.size {
            return Err(
              self
                .stream
                .violation("a download sent more bytes than its size"),
            );
          }
          self.stream.consumed(b.len());
          return Ok(Some(b));
        }
        Inbound::Result(body) => {
          let done: DownloadDone = outcome(&body)?;
          if done.size != self.received {
            return Err(
              self
                .stream
                .violation("a download's size does not match its data"),
            );
          }
          return Ok(None);
        }
        Inbound::Head(_) | Inbound::End => {}
      }
    }
  }
}

/// The agent's answer to `upload_staged`.
pub enum Staging {
  /// Put the bytes there, then `commit`.
  Ready(StagedUpload),
  /// Why the agent will not stage this write.
  Declined(String),
}

/// A staged write waiting for its bytes. Dropping it cancels it: the agent removes what was
/// staged and the temporary file it made.
pub struct StagedUpload {
  pub head: StagedHead,
  stream: Stream,
}

impl StagedUpload {
  /// Tells the agent the bytes are in place; it checks them and moves them into place. `None`:
  /// the agent could not see them after all (a runtime whose root file system is its own) and
  /// declines; send the bytes with `upload`.
  pub async fn commit(mut self) -> Result<Option<UploadDone>, ClientError> {
    self.stream.send_end();
    loop {
      match self.stream.next().await? {
        Inbound::Result(body) => {
          let done: StagedDone = outcome(&body)?;
          return Ok(
            done
              .declined
              .is_none()
              .then_some(UploadDone { size: done.size }),
          );
        }
        Inbound::Data(_) => return Err(self.stream.violation("data on a staged upload")),
        Inbound::Head(_) | Inbound::End => {}
      }
    }
  }
}

impl AgentClient {
  /// Writes a file from `source`, streamed in chunks under the agent's credit. Nothing is
  /// left behind when it fails (the agent writes a temporary file and renames it into place).
  pub async fn upload<R>(&self, spec: UploadSpec, mut source: R) -> Result<UploadDone, ClientError>
  where
    R: AsyncRead + Unpin,
  {
    let mut s = self.open(&Request::Upload(spec))?;
    let mut buf = BytesMut::new();
    loop {
      buf.reserve(MAX_DATA);
      let n = (&mut source)
        .take(MAX_DATA as u64)
        .read_buf(&mut buf)
        .await
        .map_err(|e| ClientError::Source(e.to_string()))?;
      if n == 0 {
        break;
      }
      if !s.send_data(buf.split().freeze()).await? {
        break; // the agent answered early (an error)
      }
    }
    s.send_end();
    loop {
      if let Inbound::Result(body) = s.next().await? {
        return outcome(&body);
      }
    }
  }

  /// `upload` from bytes in memory (sent without copying).
  pub async fn upload_bytes(
    &self,
    spec: UploadSpec,
    data: Bytes,
  ) -> Result<UploadDone, ClientError> {
    let mut s = self.open(&Request::Upload(spec))?;
    s.send_data(data).await?;
    s.send_end();
    loop {
      if let Inbound::Result(body) = s.next().await? {
        return outcome(&body);
      }
    }
  }

  /// Asks the agent to stage a write of `spec.size` bytes that the caller then puts through the
  /// engine's archive endpoint (`Staging::Ready`), or learns why it will not
  /// (`Staging::Declined`: send the bytes with `upload`).
  pub async fn upload_staged(&self, spec: StagedUploadSpec) -> Result<Staging, ClientError> {
    let mut s = self.open(&Request::UploadStaged(spec))?;
    loop {
      match s.next().await? {
        Inbound::Head(body) => {
          let head: StagedHead = serde_json::from_slice(&body)
            .map_err(|e| s.violation(&format!("an unreadable staged head: {e}")))?;
          return Ok(Staging::Ready(StagedUpload { head, stream: s }));
        }
        Inbound::Result(body) => {
          let done: StagedDone = outcome(&body)?;
          return match done.declined {
            Some(why) => Ok(Staging::Declined(why)),
            None => Err(s.violation("a staged upload ended before it was staged")),
          };
        }
        Inbound::Data(_) => return Err(s.violation("data on a staged upload")),
        Inbound::End => {}
      }
    }
  }

  /// Starts a download: the file's size first (a file over `spec.max_bytes` is refused before
  /// any byte is sent), then its bytes through `Download::chunk`.
  pub async fn download(&self, spec: DownloadSpec) -> Result<Download, ClientError> {
    let mut s = self.open(&Request::Download(spec))?;
    loop {
      match s.next().await? {
        Inbound::Head(body) => {
          let head: DownloadHead = serde_json::from_slice(&body)
            .map_err(|e| s.violation(&format!("an unreadable download head: {e}")))?;
          return Ok(Download {
            head,
            stream: s,
            received: 0,
          });
        }
        Inbound::Result(body) => {
          // Only an error may come without a head.
          outcome::<DownloadDone>(&body)?;
          return Err(s.violation("a download ended without its head"));
        }
        Inbound::Data(_) => return Err(s.violation("download data before its head")),
        Inbound::End => {}
      }
    }
  }

  /// A whole file in memory (at most `spec.max_bytes`).
  pub async fn download_bytes(&self, spec: DownloadSpec) -> Result<Vec<u8>, ClientError> {
    let mut d = self.download(spec).await?;
    let mut out = Vec::with_capacity(d.head.size as usize);
    while let Some(chunk) = d.chunk().await? {
      out.extend_from_slice(&chunk);
    }
    Ok(out)
  }

  /// What is at a path (`None` when nothing is).
  pub async fn stat(&self, spec: StatSpec) -> Result<Option<StatInfo>, ClientError> {
    self.call(&Request::Stat(spec)).await
  }

  /// Makes the layout directories with their owners and modes (and the activity file).
  pub async fn layout(&self, spec: LayoutSpec) -> Result<(), ClientError> {
    self.call(&Request::Layout(spec)).await
  }
}
