//! The time and size limits of calls and engine requests: `execTimeoutMs`, `fileMaxBytes`,
//! `uploadMaxBytes`, `maxOutputBytes`, `engineTimeoutMs` and the Code Mode in-flight bounds.

use crate::config::check::{bad, positive_int};
use crate::config::options::ProviderOptions;
use crate::util::errors::Result;

/// Default for `execTimeoutMs`.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 60_000;
/// Default for `fileMaxBytes` (the download cap): TrueForge's own download limit, 20 MiB.
pub const DEFAULT_FILE_MAX_BYTES: u64 = 20 * 1024 * 1024;
/// Largest `uploadMaxBytes` accepted: JavaScript's largest exact integer. An upload is streamed
/// from the caller's buffer, so its cap guards the sandbox's disk, not the host's memory.
const MAX_UPLOAD_CAP: u64 = (1 << 53) - 1;
/// Default for `maxOutputBytes`.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 10 * 1024 * 1024;
/// Largest exec timeout accepted (a week): beyond that a typo is likelier than intent.
const MAX_EXEC_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;
/// Caps above 1 GiB would let one call hold that much in the host process.
const MAX_BYTES_CAP: u64 = 1024 * 1024 * 1024;
/// Default for `codeModeSandboxInflightBytes`: one request of the largest size Code Mode takes.
pub const DEFAULT_CODE_MODE_SANDBOX_INFLIGHT: u64 = 64 * 1024 * 1024;
/// Default for `codeModeProviderInflightBytes`: four sandboxes' worth.
pub const DEFAULT_CODE_MODE_PROVIDER_INFLIGHT: u64 = 256 * 1024 * 1024;
/// Smallest in-flight bound accepted: below it ordinary requests would be refused.
const MIN_INFLIGHT: u64 = 64 * 1024;
/// Largest `codeModeProviderInflightBytes` accepted.
const MAX_PROVIDER_INFLIGHT: u64 = 16 * 1024 * 1024 * 1024;
/// Default for `engineTimeoutMs`.
pub const DEFAULT_ENGINE_TIMEOUT_MS: u64 = 30_000;
/// Largest `engineTimeoutMs` accepted: ten minutes.
const MAX_ENGINE_TIMEOUT_MS: u64 = 600_000;

/// Bounds on the Code Mode request bytes held at once (`codeMode*InflightBytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflightBounds {
  pub per_sandbox: u64,
  pub per_provider: u64,
}

/// The time and size limits of calls and engine requests, checked in the order the options are
/// reported.
pub(crate) struct Sizes {
  pub(crate) exec_timeout_ms: u64,
  pub(crate) file_max_bytes: u64,
  pub(crate) upload_max_bytes: Option<u64>,
  pub(crate) max_output_bytes: u64,
  pub(crate) engine_timeout_ms: u64,
  pub(crate) code_mode_inflight: InflightBounds,
}

impl Sizes {
  pub(crate) fn take(o: &mut ProviderOptions) -> Result<Self> {
    let exec_timeout_ms = positive_int(
      "execTimeoutMs",
      o.exec_timeout_ms.take(),
      DEFAULT_EXEC_TIMEOUT_MS,
      MAX_EXEC_TIMEOUT_MS,
    )?;
    let file_max_bytes = positive_int(
      "fileMaxBytes",
      o.file_max_bytes.take(),
      DEFAULT_FILE_MAX_BYTES,
      MAX_BYTES_CAP,
    )?;
    let upload_max_bytes = o
      .upload_max_bytes
      .take()
      .map(|v| positive_int("uploadMaxBytes", Some(v), 0, MAX_UPLOAD_CAP))
      .transpose()?;
    let max_output_bytes = positive_int(
      "maxOutputBytes",
      o.max_output_bytes.take(),
      DEFAULT_MAX_OUTPUT_BYTES,
      MAX_BYTES_CAP,
    )?;
    if max_output_bytes < 1024 {
      return Err(bad(
        "maxOutputBytes",
        "must be at least 1024 so that head and tail both fit",
      ));
    }
    let engine_timeout_ms = positive_int(
      "engineTimeoutMs",
      o.engine_timeout_ms.take(),
      DEFAULT_ENGINE_TIMEOUT_MS,
      MAX_ENGINE_TIMEOUT_MS,
    )?;
    let inflight = |option: &str, v, default, max| {
      let n = positive_int(option, v, default, max)?;
      if n < MIN_INFLIGHT {
        return Err(bad(
          option,
          format!("{n} is below the minimum {MIN_INFLIGHT}"),
        ));
      }
      Ok(n)
    };
    let code_mode_inflight = InflightBounds {
      per_sandbox: inflight(
        "codeModeSandboxInflightBytes",
        o.code_mode_sandbox_inflight_bytes.take(),
        DEFAULT_CODE_MODE_SANDBOX_INFLIGHT,
        MAX_BYTES_CAP,
      )?,
      per_provider: inflight(
        "codeModeProviderInflightBytes",
        o.code_mode_provider_inflight_bytes.take(),
        DEFAULT_CODE_MODE_PROVIDER_INFLIGHT,
        MAX_PROVIDER_INFLIGHT,
      )?,
    };
    Ok(Self {
      exec_timeout_ms,
      file_max_bytes,
      upload_max_bytes,
      max_output_bytes,
      engine_timeout_ms,
      code_mode_inflight,
    })
  }
}

#[cfg(test)]
mod tests {
  use serde_json::json;

  use crate::config::tests::err_option;
  use crate::config::ProviderConfig;

  #[test]
  fn code_mode_inflight_bounds_are_checked() {
    let c = ProviderConfig::with_image(json!({
      "codeModeSandboxInflightBytes": 1 << 20, "codeModeProviderInflightBytes": 3u64 << 30
    }))
    .unwrap();
    assert_eq!(c.code_mode_inflight.per_sandbox, 1 << 20);
    assert_eq!(c.code_mode_inflight.per_provider, 3 << 30);
    for (option, v) in [
      ("codeModeSandboxInflightBytes", json!(1024)),
      ("codeModeSandboxInflightBytes", json!((1u64 << 30) + 1)),
      ("codeModeSandboxInflightBytes", json!("64MiB")),
      ("codeModeSandboxInflightBytes", json!(1.5)),
      ("codeModeProviderInflightBytes", json!(0)),
      ("codeModeProviderInflightBytes", json!((16u64 << 30) + 1)),
    ] {
      let mut o = json!({ "image": "x" });
      o[option] = v.clone();
      assert_eq!(err_option(o), option, "{option}: {v}");
    }
  }
}
