//! The napi layer: converts JavaScript values to the core's types and the core's errors to
//! JavaScript errors carrying a stable code. No behaviour lives here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use napi::bindgen_prelude::{Buffer, Either, External, FnArgs, Function, PromiseRaw, Uint32Array};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Env;
use napi_derive::napi;
use serde_json::Value;

use crate::codemode::{self, Request, RequestSink, Session};
use crate::config::ProviderConfig;
use crate::images::Build;
use crate::napi::js::{promise, promise_here, to_js};
use crate::provider::{ExecOutcome, ExecParams, Provider};
use crate::sandbox::{container, layout};
use crate::util::logging::{Logger, Sink};

/// Image readiness, as the contract's `SandboxBuild`.
#[napi(object)]
pub struct NativeBuild {
  pub status: String,
  pub reason: Option<String>,
  pub metadata: Option<HashMap<String, String>>,
}

impl From<Build> for NativeBuild {
  fn from(b: Build) -> Self {
    Self {
      status: b.status.as_str().to_string(),
      reason: b.reason,
      metadata: b.metadata.map(|m| m.into_iter().collect()),
    }
  }
}

/// The fixed in-container layout.
#[napi(object)]
pub struct NativeLayout {
  pub uploads_dir: String,
  pub skills_dir: String,
  pub tool_results_dir: String,
  pub git_downloader_path: String,
  pub git_credentials_path: String,
}

type LogFn = ThreadsafeFunction<String, (), String, napi::Status, false, true>;
/// One Code Mode request for JavaScript: its cost token (see lib/transport.js; none for a small
/// one), the relay's generation, the request's number, and its text with, for a large one, the
/// plan to build it by in slices.
type RequestArgs = FnArgs<(Option<External<()>>, u32, u32, Payload, Option<Uint32Array>)>;
type Payload = Either<String, Buffer>;

/// Requests whose values take this much or more carry a cost token: below it the token would
/// cost more than the bytes it reports (V8 counts the values themselves in its heap anyway).
const COSTED_REQUEST_BYTES: u64 = 64 * 1024;

/// A request as JavaScript takes it: its cost token, its text, its plan.
fn for_js(request: Request) -> (Option<External<()>>, Payload, Option<Uint32Array>) {
  let Request { payload, measured } = request;
  let heap = measured.heap;
  let cost = (heap >= COSTED_REQUEST_BYTES)
    .then(|| External::new_with_size_hint((), usize::try_from(heap).unwrap_or(usize::MAX)));
  match measured.plan {
    // Built in slices from the bytes themselves, shared with JavaScript, not copied.
    Some(plan) => (
      cost,
      Either::B(Buffer::from(payload)),
      Some(Uint32Array::new(plan)),
    ),
    // Text, not a Buffer: the bytes are copied into a JavaScript string once and freed here at
    // once, while a Buffer's would wait for a collection; JSON.parse needs a string anyway.
    // Invalid UTF-8 becomes U+FFFD, as Buffer#toString does.
    None => {
      let text = String::from_utf8(payload)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
      (cost, Either::A(text), None)
    }
  }
}
type RequestFn = ThreadsafeFunction<RequestArgs, (), RequestArgs, napi::Status, false, true>;

/// The native half of `DockerSandboxProvider`; `index.js` wraps it.
#[napi]
pub struct NativeProvider {
  inner: Arc<Provider>,
}

#[napi]
impl NativeProvider {
  /// `options` is the constructor's options object without `errors` and `logger`; `log`, when
  /// given, receives one JSON string `{ level, message, meta }` per event.
  #[napi(constructor)]
  pub fn new(
    env: &Env,
    // Taken as JSON so that a wrong type is refused by our checks, naming the option, rather
    // than by napi's conversion, naming neither.
    #[napi(ts_arg_type = "NativeProviderOptions")] options: Value,
    log: Option<Function<'_, String, ()>>,
    // Where the agent binaries are (index.js: agent-bin/); not an option of the caller's.
    agent_dir: Option<String>,
  ) -> napi::Result<Self> {
    let mut cfg = ProviderConfig::from_json(options).map_err(|e| to_js(env, e))?;
    cfg.agent_bin_dir = agent_dir.map(std::path::PathBuf::from);
    let sink: Option<Sink> = match log {
      Some(f) => {
        let tsfn: LogFn = f
          .build_threadsafe_function()
          .weak::<true>()
          .callee_handled::<false>()
          .build()?;
        let tsfn = Arc::new(tsfn);
        Some(Arc::new(move |level, message: &str, meta: &Value| {
          let line =
            serde_json::json!({ "level": level.as_str(), "message": message, "meta": meta })
              .to_string();
          tsfn.call(line, ThreadsafeFunctionCallMode::NonBlocking);
        }))
      }
      None => None,
    };
    let inner = Provider::new(cfg, Logger::new(sink)).map_err(|e| to_js(env, e))?;
    Ok(Self {
      inner: Arc::new(inner),
    })
  }

  /// The namespace containers are scoped to.
  #[napi(getter)]
  pub fn namespace(&self) -> String {
    self.inner.config().namespace.clone()
  }

  /// The engine address in use.
  #[napi(getter)]
  pub fn docker_host(&self) -> String {
    self.inner.host().to_string()
  }

  /// What this provider's sandboxes may reach, in a few lines (for `doctor`).
  #[napi(getter)]
  pub fn egress(&self) -> String {
    self.inner.config().egress.mode.describe()
  }

  /// Whether calls go through the in-sandbox agent (the `agent` option).
  #[napi(getter)]
  pub fn agent(&self) -> bool {
    self.inner.config().agent
  }

  /// What serves a sandbox's calls: `{ mode: 'agent', version, arch, uid, pid, path, asUser,
  /// openat2, subreaper }`, or `{ mode: 'engine-exec', reason }`.
  #[napi(ts_return_type = "Promise<Record<string, unknown>>")]
  pub fn agent_status<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
  ) -> napi::Result<PromiseRaw<'env, Value>> {
    let inner = self.inner.clone();
    promise(env, async move { inner.agent_status(&sandbox_id).await })
  }

  /// What a sandbox may reach, and under a policy what its connections did in this process.
  #[napi(ts_return_type = "Promise<any>")]
  pub fn egress_stats<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
  ) -> napi::Result<PromiseRaw<'env, Value>> {
    let inner = self.inner.clone();
    promise(env, async move { inner.egress_stats(&sandbox_id).await })
  }

  #[napi]
  pub fn layout(&self) -> NativeLayout {
    NativeLayout {
      uploads_dir: layout::UPLOADS_DIR.into(),
      skills_dir: layout::SKILLS_DIR.into(),
      tool_results_dir: layout::TOOL_RESULTS_DIR.into(),
      git_downloader_path: layout::GIT_DOWNLOADER_PATH.into(),
      git_credentials_path: layout::GIT_CREDENTIALS_PATH.into(),
    }
  }

  #[napi]
  pub fn additional_instructions(&self) -> String {
    self.inner.additional_instructions()
  }

  #[napi]
  pub fn create_sandbox<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, String>> {
    let inner = self.inner.clone();
    promise(env, async move { inner.create_sandbox().await })
  }

  /// Runs a command: resolves to `[exitCode, output]`, or to the error's text when the command
  /// never ran. Positional, and an array back: this is the hot call, and an object's named
  /// properties are read and made one by one, each costing more than the array.
  #[napi(ts_return_type = "Promise<[number, string] | string>")]
  pub fn exec<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
    command: String,
    cwd: Option<String>,
    vars: Option<HashMap<String, String>>,
    timeout_seconds: Option<f64>,
  ) -> napi::Result<PromiseRaw<'env, Either<(i32, String), String>>> {
    let inner = self.inner.clone();
    let p = ExecParams {
      sandbox_id,
      command,
      cwd,
      env: vars
        .map(|m| m.into_iter().collect::<BTreeMap<_, _>>())
        .unwrap_or_default(),
      timeout_seconds,
    };
    promise_here(env, async move {
      Ok(match inner.exec(p).await? {
        ExecOutcome::Ran { exit_code, result } => Either::A((exit_code, result)),
        ExecOutcome::Failed { error } => Either::B(error),
      })
    })
  }

  /// Throws `SANDBOX_NOT_AVAILABLE` for an id outside the grammar, as every call does before it
  /// looks at its other arguments; for checks the JavaScript layer makes itself.
  #[napi]
  pub fn check_sandbox_id(&self, env: &Env, sandbox_id: String) -> napi::Result<()> {
    container::name_for(&self.inner.config().namespace, &sandbox_id)
      .map(|_| ())
      .map_err(|e| to_js(env, e))
  }

  #[napi(ts_return_type = "Promise<void>")]
  pub fn upload_file<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
    remote_path: String,
    content: Buffer,
  ) -> napi::Result<PromiseRaw<'env, ()>> {
    let inner = self.inner.clone();
    // The caller's buffer itself, not a copy: it stays alive until the upload is done.
    let bytes = bytes::Bytes::from_owner(content);
    promise(env, async move {
      inner.upload_file(&sandbox_id, &remote_path, bytes).await
    })
  }

  #[napi]
  pub fn download_file<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
    path: String,
  ) -> napi::Result<PromiseRaw<'env, Buffer>> {
    let inner = self.inner.clone();
    promise(env, async move {
      Ok(Buffer::from(inner.download_file(&sandbox_id, &path).await?))
    })
  }

  #[napi]
  pub fn remove_sandbox<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
  ) -> napi::Result<PromiseRaw<'env, bool>> {
    let inner = self.inner.clone();
    promise(env, async move { inner.remove_sandbox(&sandbox_id).await })
  }

  /// Ends this instance's background work (the engine's, when it is its last provider);
  /// resolves once that work has stopped. Never deletes sandboxes.
  #[napi]
  pub async fn dispose(&self) {
    self.inner.dispose().await
  }

  /// Removes this namespace's sandboxes stopped for longer than the delete interval.
  #[napi]
  pub fn reap_stale<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, Vec<String>>> {
    let inner = self.inner.clone();
    promise(env, async move { inner.reap_stale().await })
  }

  /// Starts filling the warm pool (a no-op without `warmPool`).
  #[napi(ts_return_type = "Promise<void>")]
  pub fn warm_up<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
    let inner = self.inner.clone();
    promise(env, async move { inner.warm_up().await })
  }

  /// A Code Mode session for one transport. `on_request(cost, generation, id, payload, plan)`
  /// receives each request from the sandbox; the answer goes back through `reply` with the same
  /// numbers.
  #[napi(
    ts_args_type = "onRequest: (cost: ExternalObject<undefined> | null, generation: number, id: number, payload: string | Buffer, plan: Uint32Array | null) => void"
  )]
  pub fn code_mode_session(
    &self,
    on_request: Function<'_, RequestArgs, ()>,
  ) -> napi::Result<NativeCodeModeSession> {
    let tsfn: RequestFn = on_request
      .build_threadsafe_function()
      .weak::<true>()
      .callee_handled::<false>()
      .build()?;
    let tsfn = Arc::new(tsfn);
    let sink: RequestSink = Arc::new(move |generation, id, request: Request| {
      let (cost, payload, plan) = for_js(request);
      tsfn.call(
        FnArgs::from((cost, generation, id, payload, plan)),
        ThreadsafeFunctionCallMode::NonBlocking,
      );
    });
    Ok(NativeCodeModeSession {
      provider: self.inner.clone(),
      session: Arc::new(Session::new(sink)),
    })
  }

  #[napi]
  pub fn build_image<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, NativeBuild>> {
    let inner = self.inner.clone();
    promise(env, async move { Ok(inner.build_image().await?.into()) })
  }

  #[napi]
  pub fn get_image_build_status<'env>(
    &self,
    env: &'env Env,
  ) -> napi::Result<PromiseRaw<'env, NativeBuild>> {
    let inner = self.inner.clone();
    promise(env, async move { Ok(inner.image_status().await?.into()) })
  }
}

/// Options of the standalone reaper (the `reap` command).
#[napi(object)]
pub struct NativeReapOptions {
  pub namespace: Option<String>,
  pub docker_host: Option<String>,
  pub older_than_minutes: Option<f64>,
  pub dry_run: Option<bool>,
}

/// Removes sandboxes of one namespace stopped for longer than `olderThanMinutes` (default the
/// provider's default delete interval); returns their ids. No provider needed (for cron).
#[napi]
pub fn reap_sandboxes(
  env: &Env,
  options: NativeReapOptions,
) -> napi::Result<PromiseRaw<'_, Vec<String>>> {
  promise(env, async move {
    crate::fleet::reaper::reap_standalone(
      options.namespace.as_deref(),
      options.docker_host.as_deref(),
      options.older_than_minutes,
      options.dry_run.unwrap_or(false),
    )
    .await
  })
}

/// One Code Mode transport's relay session (see `codemode::Session`).
#[napi]
pub struct NativeCodeModeSession {
  provider: Arc<Provider>,
  session: Arc<Session>,
}

#[napi]
impl NativeCodeModeSession {
  /// The in-sandbox socket the client connects to.
  #[napi(getter)]
  pub fn socket_path(&self) -> String {
    self.session.socket_path().to_string()
  }

  /// The live relay's pid inside the container, if any.
  #[napi(getter)]
  pub fn relay_pid(&self) -> Option<u32> {
    self.session.relay_pid()
  }

  /// Makes sure a live relay serves this sandbox (launching or relaunching one). A request
  /// not answered within `request_timeout_seconds` (default 300) is answered with an error.
  #[napi(ts_return_type = "Promise<void>")]
  pub fn start<'env>(
    &self,
    env: &'env Env,
    sandbox_id: String,
    request_timeout_seconds: Option<f64>,
  ) -> napi::Result<PromiseRaw<'env, ()>> {
    let (provider, session) = (self.provider.clone(), self.session.clone());
    // Anything but a positive number of seconds (at most a week) leaves the timeout as it is.
    let timeout = request_timeout_seconds
      .filter(|s| s.is_finite() && *s > 0.0 && *s <= 7.0 * 86_400.0)
      .map(std::time::Duration::from_secs_f64);
    promise(env, async move {
      session.start(provider.as_ref(), &sandbox_id, timeout).await
    })
  }

  /// Answers request `id` of relay `generation`; false when that relay is gone or no longer
  /// awaits it (it timed out). `watched`: the request's values are watched for collection,
  /// which gives its room back (`collected`); otherwise the reply does.
  #[napi]
  pub fn reply(&self, generation: u32, id: u32, payload: Buffer, watched: Option<bool>) -> bool {
    self
      .session
      .reply(generation, id, &payload, watched.unwrap_or(false))
  }

  /// Nothing of ours holds the values of watched request `id` any more: V8 is asked for a
  /// collection (by external memory pressure) when one is due, so that their room comes back.
  #[napi]
  pub fn let_go(&self, env: &Env, generation: u32, id: u32) -> napi::Result<()> {
    if let Some(pressure) = self.session.let_go(generation, id) {
      env.adjust_external_memory(pressure)?;
      env.adjust_external_memory(-pressure)?;
    }
    Ok(())
  }

  /// The values of request `id` of relay `generation` were collected: its room is given back.
  #[napi]
  pub fn collected(&self, generation: u32, id: u32) {
    self.session.collected(generation, id)
  }

  /// The current relay's lane, once: the JavaScript side reads its stream (`fd`, which it
  /// then owns) and hands what it reads to `feed`. Null when there is none to take.
  #[napi]
  pub fn take_lane(&self) -> Option<NativeLane> {
    #[cfg(unix)]
    {
      use std::os::fd::IntoRawFd;
      self.session.take_lane().map(|(generation, fd)| NativeLane {
        generation,
        fd: fd.into_raw_fd(),
      })
    }
    #[cfg(not(unix))]
    None
  }

  /// Bytes read from lane `generation`: the calls now complete (answered through `reply`), and
  /// whether to stop reading until `room` resolves. Null when that lane is over (stop reading).
  #[napi]
  pub fn feed(&self, generation: u32, chunk: &[u8]) -> Option<NativeFed> {
    #[cfg(unix)]
    {
      let fed = self.session.feed(generation, chunk)?.ok()?;
      let calls = fed
        .calls
        .into_iter()
        .map(|(id, request)| {
          let (cost, payload, plan) = for_js(request);
          NativeLaneCall {
            id,
            payload,
            plan,
            cost,
          }
        })
        .collect();
      Some(NativeFed {
        calls,
        paused: fed.paused,
      })
    }
    #[cfg(not(unix))]
    {
      let _ = (generation, chunk);
      None
    }
  }

  /// Resolves once lane `generation` has room for the call that paused it.
  #[napi]
  pub async fn room(&self, generation: u32) {
    #[cfg(unix)]
    self.session.room(generation).await;
    #[cfg(not(unix))]
    let _ = generation;
  }

  /// Lane `generation`'s stream closed.
  #[napi]
  pub fn lane_ended(&self, generation: u32) {
    #[cfg(unix)]
    self.session.lane_ended(generation);
    #[cfg(not(unix))]
    let _ = generation;
  }

  /// Stops the relay and waits for it to end. Safe at any time.
  #[napi]
  pub async fn stop(&self) {
    self.session.stop().await
  }
}

/// A lane's stream for the JavaScript side to read.
#[napi(object)]
pub struct NativeLane {
  pub generation: u32,
  pub fd: i32,
}

/// One call read from a lane.
#[napi(object, object_from_js = false)]
pub struct NativeLaneCall {
  pub id: u32,
  /// Its text; a Buffer when it comes with a plan.
  #[napi(ts_type = "string | Buffer")]
  pub payload: Payload,
  /// The steps to build a large request by in slices (see `codemode::meter`).
  pub plan: Option<Uint32Array>,
  /// What the request's values hold, told to V8 while they live (large requests only).
  #[napi(ts_type = "ExternalObject<undefined> | null")]
  pub cost: Option<External<()>>,
}

/// What one `feed` yields.
#[napi(object, object_from_js = false)]
pub struct NativeFed {
  pub calls: Vec<NativeLaneCall>,
  pub paused: bool,
}

/// The steps of a large Code Mode request's plan (see `codemode::meter`), for the builder in
/// lib/transport.js.
#[napi(object)]
pub struct NativePlanOps {
  pub object: u32,
  pub array: u32,
  pub end: u32,
  pub key: u32,
  pub run: u32,
  pub string: u32,
  /// Set on a key or string step whose text holds escapes.
  pub escaped: u32,
}

/// Largest Code Mode request or reply, in bytes (the agent's protocol defines it).
#[napi]
pub const CODE_MODE_MAX_MESSAGE_BYTES: u32 = codemode::MAX_MESSAGE_BYTES as u32;

#[napi]
pub fn code_mode_plan_ops() -> NativePlanOps {
  use codemode::meter::*;
  NativePlanOps {
    object: OP_OBJECT,
    array: OP_ARRAY,
    end: OP_END,
    key: OP_KEY,
    run: OP_RUN,
    string: OP_STRING,
    escaped: ESCAPED,
  }
}

/// What the host makes of one Code Mode request (see `codemode::meter`).
#[napi(object, object_from_js = false)]
pub struct NativeMeasured {
  /// Bytes its values take in V8's heap, estimated from above.
  pub heap: f64,
  pub values: f64,
  /// The steps to build it in slices, when it is too large to parse whole.
  pub plan: Option<Uint32Array>,
  /// Why it is refused, when it is.
  pub unfit: Option<String>,
}

/// Measures a Code Mode request as the host does before any JavaScript sees it; `small_steps`
/// makes plans of tiny steps (for tests of the builder).
#[napi]
pub fn code_mode_measure(payload: &[u8], small_steps: Option<bool>) -> NativeMeasured {
  use codemode::meter::Meter;
  let mut meter = match small_steps.unwrap_or(false) {
    true => Meter::with_steps(200, 16, 0),
    false => Meter::default(),
  };
  meter.push(payload);
  match meter.finish() {
    Ok(m) => NativeMeasured {
      heap: m.heap as f64,
      values: m.values as f64,
      plan: m.plan.map(Uint32Array::new),
      unfit: None,
    },
    Err(why) => NativeMeasured {
      heap: 0.0,
      values: 0.0,
      plan: None,
      unfit: Some(why.message()),
    },
  }
}

/// The Code Mode client module TrueForge installs in the sandbox, and where.
#[napi(object)]
pub struct NativeCodeModeClient {
  pub content: String,
  pub remote_path: String,
}

#[napi]
pub fn code_mode_client() -> NativeCodeModeClient {
  NativeCodeModeClient {
    content: codemode::CLIENT_SOURCE.to_string(),
    remote_path: codemode::CLIENT_PATH.to_string(),
  }
}
