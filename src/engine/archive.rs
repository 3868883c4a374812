//! Files through the engine's archive endpoints: the stat of a path, a tar of it downloaded, a tar
//! uploaded and extracted.

use std::time::Duration;

use bollard::container::PathStatResponse;
use bollard::query_parameters::{
  ContainerArchiveInfoOptions, DownloadFromContainerOptions, UploadToContainerOptions,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::engine::request::{absent_on, status_of};
use crate::engine::Engine;
use crate::util::errors::{Result, SandboxError};

impl Engine {
  /// The archive stat of `path` in a container; `None` on 404 (the path or the container is
  /// missing: the caller tells which).
  pub async fn archive_stat(
    &self,
    operation: &str,
    container: &str,
    path: &str,
  ) -> Result<Option<PathStatResponse>> {
    let opts = ContainerArchiveInfoOptions {
      path: path.to_string(),
    };
    let r = self
      .control(operation, || {
        self
          .docker
          .get_container_archive_info(container, Some(opts.clone()))
      })
      .await;
    absent_on(r, &[404])
  }

  /// A tar of `path` in a container, streamed. A missing path (or container) arrives as the
  /// stream's first item, `FileNotFound`.
  pub fn download_tar(
    &self,
    operation: &'static str,
    container: &str,
    path: &str,
  ) -> impl Stream<Item = Result<Bytes>> + '_ {
    let opts = DownloadFromContainerOptions {
      path: path.to_string(),
    };
    let path = path.to_string();
    self
      .docker
      .download_from_container(container, Some(opts))
      .map(move |r| {
        r.map_err(|e| match self.map_error(operation, e) {
          SandboxError::Engine { status: 404, .. } => {
            SandboxError::FileNotFound { path: path.clone() }
          }
          other => other,
        })
      })
  }

  /// Extracts a tar held in memory into `opts.path`, within `limit`; with `retry`, a connection
  /// that broke before any answer is retried once (extracting twice is harmless).
  pub async fn upload_tar(
    &self,
    operation: &str,
    container: &str,
    opts: UploadToContainerOptions,
    tar: Bytes,
    limit: Duration,
    retry: bool,
  ) -> Result<()> {
    let dir = opts.path.clone();
    let request = || {
      self.docker.upload_to_container(
        container,
        Some(opts.clone()),
        bollard::body_full(tar.clone()),
      )
    };
    let r = if retry {
      self.control_within(limit, operation, request).await
    } else {
      self.within(limit, operation, request()).await
    };
    missing_dir(r, dir)
  }

  /// Extracts a streamed tar into `opts.path`, within `limit` (the whole body included).
  pub async fn upload_tar_stream(
    &self,
    operation: &str,
    container: &str,
    opts: UploadToContainerOptions,
    tar: impl Stream<Item = Bytes> + Send + 'static,
    limit: Duration,
  ) -> Result<()> {
    let dir = opts.path.clone();
    let r = self
      .within(
        limit,
        operation,
        self
          .docker
          .upload_to_container(container, Some(opts), bollard::body_stream(tar)),
      )
      .await;
    missing_dir(r, dir)
  }
}

/// An upload's 404 (the directory, or the container, is missing) as `FileNotFound`.
fn missing_dir(r: Result<()>, dir: String) -> Result<()> {
  match r {
    Err(e) if status_of(&e) == Some(404) => Err(SandboxError::FileNotFound { path: dir }),
    other => other,
  }
}
