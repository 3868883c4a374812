//! TLS to `tcp://` engines in pure Rust (rustls with the `ring` provider: no OpenSSL, no cmake,
//! so the addon cross-compiles). The rustls configuration is built here from PEM held in memory
//! (see `endpoint`), and handed to bollard as a custom transport over a pooled hyper client, so
//! no key ever touches a temporary file. Failures are classified into `EngineTls` errors that
//! name the host and the fix.

use std::sync::Arc;

use bollard::errors::Error as BollardError;
use bollard::{ClientVersion, Docker};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::engine::endpoint::Tls;
use crate::util::errors::{Result, SandboxError};

fn provider() -> Arc<CryptoProvider> {
  Arc::new(rustls::crypto::ring::default_provider())
}

fn bad_material(host: &str, what: &str, detail: impl std::fmt::Display) -> SandboxError {
  SandboxError::EngineTls {
    host: host.to_string(),
    detail: format!("the {what} could not be used: {detail}"),
    fix: "give PEM files (ca.pem, cert.pem, key.pem) as `docker --tlsverify` takes them".into(),
  }
}

/// The rustls client configuration for one engine.
pub fn client_config(host: &str, tls: &Tls) -> Result<rustls::ClientConfig> {
  let provider = provider();
  let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
    .with_safe_default_protocol_versions()
    .map_err(|e| SandboxError::Internal(format!("rustls: {e}")))?;
  let builder = if tls.verify {
    let ca = tls
      .ca
      .as_deref()
      .ok_or_else(|| bad_material(host, "CA", "none given, and verification needs one"))?;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_slice_iter(ca)
      .collect::<std::result::Result<Vec<_>, _>>()
      .map_err(|e| bad_material(host, "CA", e))?;
    if certs.is_empty() {
      return Err(bad_material(host, "CA", "no certificate in it"));
    }
    for c in certs {
      roots.add(c).map_err(|e| bad_material(host, "CA", e))?;
    }
    builder.with_root_certificates(roots)
  } else {
    builder
      .dangerous()
      .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
  };
  match (&tls.cert, &tls.key) {
    (Some(cert), Some(key)) => {
      let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad_material(host, "client certificate", e))?;
      if chain.is_empty() {
        return Err(bad_material(
          host,
          "client certificate",
          "no certificate in it",
        ));
      }
      if let Some(not_after) = not_after(&chain[0]) {
        let now = std::time::SystemTime::now()
          .duration_since(std::time::UNIX_EPOCH)
          .map(|d| d.as_secs())
          .unwrap_or(0);
        if not_after < now {
          return Err(SandboxError::EngineTls {
            host: host.to_string(),
            detail: format!(
              "the client certificate ({}) expired {} minute(s) ago",
              tls.origin,
              (now - not_after) / 60
            ),
            fix: "renew the client certificate (cert.pem) with the engine's CA".into(),
          });
        }
      }
      let key =
        PrivateKeyDer::from_pem_slice(key).map_err(|e| bad_material(host, "client key", e))?;
      builder
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad_material(host, "client certificate and key", e))
    }
    _ => Ok(builder.with_no_client_auth()),
  }
}

/// One DER element at the start of `b`: (tag, contents, rest).
fn der(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
  let (&tag, b) = b.split_first()?;
  let (&first, mut b) = b.split_first()?;
  let len = if first < 0x80 {
    first as usize
  } else {
    let n = (first & 0x7f) as usize;
    if n == 0 || n > 4 || b.len() < n {
      return None;
    }
    let v = b[..n].iter().fold(0usize, |a, &x| (a << 8) | x as usize);
    b = &b[n..];
    v
  };
  (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

/// The `notAfter` of an X.509 certificate, in epoch seconds.
pub fn not_after(cert: &[u8]) -> Option<u64> {
  let (_, cert, _) = der(cert)?;
  let (_, mut tbs, _) = der(cert)?;
  let mut next = || -> Option<(u8, &[u8])> {
    let (t, c, rest) = der(tbs)?;
    tbs = rest;
    Some((t, c))
  };
  let (mut tag, _) = next()?;
  if tag == 0xa0 {
    tag = next()?.0; // the serial after an explicit version
  }
  let _ = tag;
  next()?; // signature algorithm
  next()?; // issuer
  let (_, validity) = next()?;
  let (_, _, rest) = der(validity)?;
  let (t, v, _) = der(rest)?;
  let s = std::str::from_utf8(v).ok()?;
  let full = match t {
    0x17 if s.len() >= 12 => {
      let yy: u32 = s[..2].parse().ok()?;
      format!("{}{s}", if yy < 50 { "20" } else { "19" })
    }
    0x18 => s.to_string(),
    _ => return None,
  };
  let f = |r: std::ops::Range<usize>| full.get(r);
  let iso = format!(
    "{}-{}-{}T{}:{}:{}Z",
    f(0..4)?,
    f(4..6)?,
    f(6..8)?,
    f(8..10)?,
    f(10..12)?,
    f(12..14)?
  );
  crate::util::timestamps::parse_time(&iso)
}

/// A bollard client speaking HTTPS to `host` (`tcp://h:p`) with `tls`.
pub fn connect(host: &str, tls: &Tls, timeout: u64, version: &ClientVersion) -> Result<Docker> {
  let config = client_config(host, tls)?;
  let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
  http.enforce_http(false);
  http.set_nodelay(true);
  let https = hyper_rustls::HttpsConnectorBuilder::new()
    .with_tls_config(config)
    .https_only()
    .enable_http1()
    .wrap_connector(http);
  let addr = format!("https://{}", host.strip_prefix("tcp://").unwrap_or(host));
  // Pooled, as before: the handshake is worth keeping the connection for.
  crate::engine::connector::docker(https, &addr, true, timeout, version)
    .map_err(|e| SandboxError::Internal(format!("TLS client: {e}")))
}

/// Accepts any engine certificate (`DOCKER_TLS` without `DOCKER_TLS_VERIFY`), still checking
/// that the handshake is signed by the key in it.
#[derive(Debug)]
struct AnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
  fn verify_server_cert(
    &self,
    _end_entity: &CertificateDer<'_>,
    _intermediates: &[CertificateDer<'_>],
    _server_name: &ServerName<'_>,
    _ocsp: &[u8],
    _now: UnixTime,
  ) -> std::result::Result<ServerCertVerified, rustls::Error> {
    Ok(ServerCertVerified::assertion())
  }

  fn verify_tls12_signature(
    &self,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
  ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
    verify_tls12_signature(
      message,
      cert,
      dss,
      &self.0.signature_verification_algorithms,
    )
  }

  fn verify_tls13_signature(
    &self,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
  ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
    verify_tls13_signature(
      message,
      cert,
      dss,
      &self.0.signature_verification_algorithms,
    )
  }

  fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
    self.0.signature_verification_algorithms.supported_schemes()
  }
}

/// The rustls error somewhere in `e`'s chain (io errors carry it as their inner error).
fn rustls_error(e: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
  let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
  while let Some(err) = cur {
    if let Some(r) = err.downcast_ref::<rustls::Error>() {
      return Some(r.clone());
    }
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
      if let Some(inner) = io.get_ref() {
        if let Some(r) = inner.downcast_ref::<rustls::Error>() {
          return Some(r.clone());
        }
        if let Some(found) = rustls_error(inner) {
          return Some(found);
        }
      }
    }
    cur = err.source();
  }
  None
}

/// The fix for a TLS failure against `host`, or `None` when `e` is not about TLS.
pub fn classify(host: &str, client_cert: bool, e: &BollardError) -> Option<SandboxError> {
  use rustls::{AlertDescription as A, CertificateError as C, Error as R};
  let tls_err = |detail: String, fix: &str| SandboxError::EngineTls {
    host: host.to_string(),
    detail,
    fix: fix.to_string(),
  };
  if let BollardError::DockerResponseServerError {
    status_code: 400,
    message,
  } = e
  {
    if message.contains("HTTP request to an HTTPS server") {
      return Some(tls_err(
        "the engine speaks TLS and this client sent plain HTTP".into(),
        "connect with TLS: set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem), use a Docker context with TLS, or give the `tls` option { ca, cert, key }",
      ));
    }
  }
  let r = rustls_error(e)?;
  let out = match &r {
    R::InvalidCertificate(C::UnknownIssuer) | R::InvalidCertificate(C::BadSignature) => tls_err(
      format!("the engine's certificate is not signed by the CA given ({r})"),
      "use the CA that signed the engine's certificate (ca.pem beside the daemon's --tlscacert)",
    ),
    R::InvalidCertificate(C::Expired) | R::InvalidCertificate(C::ExpiredContext { .. }) => tls_err(
      format!("the engine's certificate has expired ({r})"),
      "renew the engine's server certificate",
    ),
    R::InvalidCertificate(C::NotValidForName)
    | R::InvalidCertificate(C::NotValidForNameContext { .. }) => tls_err(
      format!("the engine's certificate does not name this host ({r})"),
      "connect with the name or IP address in the engine certificate's subjectAltName, or reissue it",
    ),
    R::InvalidCertificate(_) => tls_err(
      format!("the engine's certificate was refused ({r})"),
      "check the engine's certificate and the CA given",
    ),
    R::AlertReceived(
      A::CertificateRequired
      | A::HandshakeFailure
      | A::BadCertificate
      | A::CertificateUnknown,
    ) if !client_cert => {
      tls_err(
        format!("the engine wants a client certificate and none was given ({r})"),
        "give the client certificate and key signed by the engine's CA (cert.pem and key.pem in DOCKER_CERT_PATH, the context's TLS material, or `tls: { cert, key }`)",
      )
    }
    R::AlertReceived(A::CertificateExpired) => tls_err(
      format!("the engine refused the client certificate as expired ({r})"),
      "renew the client certificate (cert.pem) with the engine's CA",
    ),
    R::AlertReceived(
      A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::UnsupportedCertificate,
    ) => tls_err(
      format!("the engine refused the client certificate ({r})"),
      "use a client certificate signed by the CA the engine trusts (its --tlscacert), and check that it has not expired",
    ),
    R::InvalidMessage(_) | R::InappropriateMessage { .. } | R::InappropriateHandshakeMessage { .. } => tls_err(
      format!("the engine did not answer in TLS ({r})"),
      "this port serves plain HTTP: use tcp:// without TLS settings (unset DOCKER_TLS_VERIFY, `tls: false`), or the engine's TLS port (usually 2376)",
    ),
    _ => tls_err(
      format!("{r}"),
      "check the TLS settings (CA, client certificate and key) against the engine's",
    ),
  };
  Some(out)
}
