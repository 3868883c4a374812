//! The one error boundary and the promise bridge every napi function uses.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use napi::bindgen_prelude::{JsObjectValue, PromiseRaw, ToNapiValue};
use napi::{Env, JsValue};

use crate::napi::start;
use crate::util::errors::SandboxError;

/// The one error boundary. napi's own async bridge rejects with an `Error<Status>`, whose `code`
/// can only be one of napi's statuses; so every fallible call settles its promise here, on the
/// JavaScript thread, where the rejection is built as an object with our stable `code` and the
/// contract's fields (`SandboxError::fields`) beside the message.
pub fn to_js(env: &Env, e: SandboxError) -> napi::Error {
  let build = || -> napi::Result<napi::Error> {
    let mut obj = env.create_error(napi::Error::from_reason(e.to_string()))?;
    obj.set_named_property("code", e.code())?;
    for (name, value) in e.fields() {
      obj.set_named_property(&name, value)?;
    }
    Ok(napi::Error::from(obj.to_unknown()))
  };
  // Only a dying environment fails to build the object; the message still says what happened.
  build().unwrap_or_else(|_| napi::Error::from_reason(e.to_string()))
}

/// Runs `fut` on napi's runtime; its `SandboxError` becomes the coded JavaScript error.
pub fn promise<'env, T, F>(env: &'env Env, fut: F) -> napi::Result<PromiseRaw<'env, T>>
where
  T: ToNapiValue + Send + 'static,
  F: Future<Output = Result<T, SandboxError>> + Send + 'static,
{
  // On the heap at once: napi's bridge and the runtime's task move what they are given several
  // times over, on the JavaScript thread, and a call's future runs to tens of KiB.
  let fut = Box::pin(fut);
  env.spawn_future_with_callback(async move { Ok(fut.await) }, |env, out| {
    out.map_err(|e| to_js(env, e))
  })
}

/// `promise`, for a call whose first steps (a request on an open connection) are quick and never
/// block: it starts on the JavaScript thread, and moves to the runtime once it waits
/// (`start`).
pub fn promise_here<'env, T, F>(env: &'env Env, fut: F) -> napi::Result<PromiseRaw<'env, T>>
where
  T: ToNapiValue + Send + 'static,
  F: Future<Output = Result<T, SandboxError>> + Send + 'static,
{
  type Settle<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;
  let (deferred, promise) = env.create_deferred::<T, Settle<T>>()?;
  let fut = Box::pin(fut);
  start::run_here(Box::pin(async move {
    let settle: Settle<T> = match AssertUnwindSafe(fut).catch_unwind().await {
      Ok(Ok(v)) => Box::new(move |_| Ok(v)),
      Ok(Err(e)) => Box::new(move |env| Err(to_js(&env, e))),
      // napi's own bridge rejects too: a promise left pending would keep Node.js waiting.
      Err(_) => Box::new(|env| {
        let e = SandboxError::Internal("the call panicked in the addon".into());
        Err(to_js(&env, e))
      }),
    };
    deferred.resolve(settle);
  }));
  Ok(PromiseRaw::new(env.raw(), promise.raw()))
}
