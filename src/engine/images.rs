//! Images: inspect, pull or import, build, and the saved sandbox images (a container committed,
//! listed by label, removed when unused).

use std::collections::HashMap;
use std::time::Duration;

use bollard::auth::DockerCredentials;
use bollard::models::{BuildInfo, CreateImageInfo, ImageInspect, ImageSummary};
use bollard::query_parameters::{
  BuildImageOptions, CommitContainerOptions, CreateImageOptions, ListImagesOptions,
  RemoveImageOptions,
};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::engine::request::absent_on;
use crate::engine::Engine;
use crate::util::errors::Result;

impl Engine {
  /// An image's inspect data; `None` when the engine does not have it.
  pub async fn inspect_image(&self, image: &str) -> Result<Option<ImageInspect>> {
    let r = self
      .control("inspect the image", || self.docker.inspect_image(image))
      .await;
    absent_on(r, &[404])
  }

  /// Pulls (or, with a `root_fs` tar, imports) an image; the engine's progress, streamed.
  pub fn create_image(
    &self,
    operation: &'static str,
    opts: CreateImageOptions,
    root_fs: Option<Bytes>,
    credentials: Option<DockerCredentials>,
  ) -> impl Stream<Item = Result<CreateImageInfo>> + '_ {
    self
      .docker
      .create_image(Some(opts), root_fs.map(bollard::body_full), credentials)
      .map(move |r| r.map_err(|e| self.map_error(operation, e)))
  }

  /// Builds an image from a context tar; the engine's progress, streamed.
  pub fn build_image(
    &self,
    opts: BuildImageOptions,
    context: Bytes,
  ) -> impl Stream<Item = Result<BuildInfo>> + '_ {
    self
      .docker
      .build_image(opts, None, Some(bollard::body_full(context)))
      .map(move |r| r.map_err(|e| self.map_error("build the image", e)))
  }

  /// Saves a container's filesystem as a new untagged image carrying `labels`; its id. Commit
  /// copies the whole writable layer, so it gets the transfer deadline, not the control one.
  pub async fn commit_container(
    &self,
    container: &str,
    labels: HashMap<String, String>,
    limit: Duration,
  ) -> Result<String> {
    let opts = CommitContainerOptions {
      container: Some(container.to_string()),
      pause: false,
      ..Default::default()
    };
    let config = bollard::models::ContainerConfig {
      labels: Some(labels),
      ..Default::default()
    };
    self
      .within(
        limit,
        "save the sandbox's files as an image",
        self.docker.commit_container(opts, config),
      )
      .await
      .map(|r| r.id)
  }

  /// Untagged images carrying every label in `labels` (`key` or `key=value`).
  pub async fn list_dangling_images(&self, labels: Vec<String>) -> Result<Vec<ImageSummary>> {
    let opts = ListImagesOptions {
      filters: Some(HashMap::from([
        ("dangling".to_string(), vec!["true".to_string()]),
        ("label".to_string(), labels),
      ])),
      ..Default::default()
    };
    self
      .control("list saved sandbox images", || {
        self.docker.list_images(Some(opts.clone()))
      })
      .await
  }

  /// Removes an image nothing uses (never forced); `false` when it is gone or still in use.
  pub async fn remove_unused_image(&self, image: &str) -> Result<bool> {
    let opts = RemoveImageOptions {
      force: false,
      noprune: false,
      ..Default::default()
    };
    let r = self
      .control("remove a saved sandbox image", || {
        self.docker.remove_image(image, Some(opts.clone()), None)
      })
      .await;
    absent_on(r, &[404, 409]).map(|r| r.is_some())
  }
}
