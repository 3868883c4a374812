//! The agent binaries the package ships (`agent-bin/trueforge-agent-<arch>`, static Linux
//! executables for the sandbox, the same for every host platform): read once per process and
//! directory, on first use, size-capped, checked to be static ELF executables for the machine
//! their names say, and hashed. The hash names the engine's agent volume and the directory the
//! binaries are placed in, so a changed binary never mixes with an older one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::sync::OnceCell;

/// Largest binary read (they are about 1 MiB; the cap only guards against a wrong file).
pub const MAX_BINARY_BYTES: u64 = 16 << 20;

/// The machines an agent is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
  X86_64,
  Aarch64,
}

impl Arch {
  pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

  /// The name in file names and in the agent's hello.
  pub fn name(self) -> &'static str {
    match self {
      Arch::X86_64 => "x86_64",
      Arch::Aarch64 => "aarch64",
    }
  }

  /// An image's `Architecture` as the engine reports it (Go's names, or the kernel's).
  pub fn of_image(arch: &str) -> Option<Arch> {
    match arch {
      "amd64" | "x86_64" => Some(Arch::X86_64),
      "arm64" | "aarch64" => Some(Arch::Aarch64),
      _ => None,
    }
  }

  /// ELF `e_machine`.
  fn elf_machine(self) -> u16 {
    match self {
      Arch::X86_64 => 62,
      Arch::Aarch64 => 183,
    }
  }

  /// The binary's file name.
  pub fn file_name(self) -> String {
    format!("trueforge-agent-{}", self.name())
  }
}

/// One checked binary.
#[derive(Debug, Clone)]
pub struct Binary {
  pub arch: Arch,
  pub bytes: Bytes,
  /// sha256, hex.
  pub sha256: String,
}

/// The binaries of one directory, with the tag naming them.
#[derive(Debug)]
pub struct Bundle {
  pub binaries: Vec<Binary>,
  /// `<package version>-<12 hex of the binaries' hash>`.
  pub tag: String,
}

impl Bundle {
  pub fn get(&self, arch: Arch) -> Option<&Binary> {
    self.binaries.iter().find(|b| b.arch == arch)
  }
}

/// Whether, and with which binaries, a provider uses the agent.
#[derive(Clone)]
pub struct Setup {
  /// The `agent` option.
  pub enabled: bool,
  pub binaries: Arc<Binaries>,
}

impl Setup {
  pub fn of(cfg: &crate::config::ProviderConfig) -> Self {
    Self {
      enabled: cfg.agent,
      binaries: Binaries::of(cfg.agent_bin_dir.as_deref()),
    }
  }
}

/// The binaries in one directory, loaded on first use. A failure (no directory, a wrong file)
/// is kept as the reason the agent cannot run, which `doctor` and the fallback warning show.
pub struct Binaries {
  dir: Option<PathBuf>,
  loaded: OnceCell<Result<Arc<Bundle>, String>>,
}

impl Binaries {
  /// The process's binaries of `dir` (one load per directory however many providers ask).
  pub fn of(dir: Option<&Path>) -> Arc<Binaries> {
    static ALL: OnceLock<Mutex<HashMap<Option<PathBuf>, Arc<Binaries>>>> = OnceLock::new();
    let mut all = ALL.get_or_init(Default::default).lock().expect("binaries");
    all
      .entry(dir.map(Path::to_path_buf))
      .or_insert_with(|| {
        Arc::new(Binaries {
          dir: dir.map(Path::to_path_buf),
          loaded: OnceCell::new(),
        })
      })
      .clone()
  }

  /// The checked binaries, or why there are none usable.
  pub async fn bundle(&self) -> Result<Arc<Bundle>, String> {
    self
      .loaded
      .get_or_init(|| async {
        let Some(dir) = &self.dir else {
          return Err("this build was given no agent binaries (index.js passes agent-bin/)".into());
        };
        load(dir).await.map(Arc::new)
      })
      .await
      .clone()
  }
}

/// Reads and checks every binary in `dir`; at least one must be there.
async fn load(dir: &Path) -> Result<Bundle, String> {
  let mut binaries = Vec::new();
  for arch in Arch::ALL {
    let path = dir.join(arch.file_name());
    match read_capped(&path).await {
      Ok(Some(bytes)) => {
        check_elf(&bytes, arch).map_err(|e| format!("{}: {e}", path.display()))?;
        let sha256 = hex(&Sha256::digest(&bytes));
        binaries.push(Binary {
          arch,
          bytes: Bytes::from(bytes),
          sha256,
        });
      }
      Ok(None) => {}
      Err(e) => return Err(format!("{}: {e}", path.display())),
    }
  }
  if binaries.is_empty() {
    return Err(format!(
      "no agent binaries in {} (trueforge-agent-x86_64, trueforge-agent-aarch64); build them with `npm run build:agent`",
      dir.display()
    ));
  }
  let mut h = Sha256::new();
  for b in &binaries {
    h.update(format!("{}:{}\n", b.arch.name(), b.sha256));
  }
  let tag = format!(
    "{}-{}",
    trueforge_agent_proto::VERSION,
    &hex(&h.finalize())[..12]
  );
  Ok(Bundle { binaries, tag })
}

/// The file's bytes, at most `MAX_BINARY_BYTES`; `None` when it does not exist.
async fn read_capped(path: &Path) -> Result<Option<Vec<u8>>, String> {
  let file = match tokio::fs::File::open(path).await {
    Ok(f) => f,
    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
    Err(e) => return Err(e.to_string()),
  };
  let mut bytes = Vec::new();
  file
    .take(MAX_BINARY_BYTES + 1)
    .read_to_end(&mut bytes)
    .await
    .map_err(|e| e.to_string())?;
  if bytes.len() as u64 > MAX_BINARY_BYTES {
    return Err(format!(
      "larger than {MAX_BINARY_BYTES} bytes: not an agent binary"
    ));
  }
  Ok(Some(bytes))
}

/// A 64-bit little-endian ELF executable for `arch` with no program interpreter (static, so
/// it runs in any image, libc or not).
pub fn check_elf(b: &[u8], arch: Arch) -> Result<(), String> {
  let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]));
  let u32_at = |o: usize| {
    b.get(o..o + 4)
      .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
  };
  let u64_at = |o: usize| {
    b.get(o..o + 8)
      .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
  };
  if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
    return Err("not a 64-bit little-endian ELF file".into());
  }
  if !matches!(u16_at(16), Some(2 | 3)) {
    return Err("not an ELF executable".into());
  }
  let machine = u16_at(18).unwrap_or(0);
  if machine != arch.elf_machine() {
    return Err(format!(
      "built for ELF machine {machine}, not {} ({})",
      arch.name(),
      arch.elf_machine()
    ));
  }
  let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
    return Err("a truncated ELF header".into());
  };
  for i in 0..phnum as u64 {
    let at = phoff
      .checked_add(i * phentsize as u64)
      .and_then(|o| usize::try_from(o).ok());
    match at.and_then(u32_at) {
      // PT_INTERP: it needs a dynamic loader, which an image may not have.
      Some(3) => return Err("dynamically linked (it names a program interpreter)".into()),
      Some(_) => {}
      None => return Err("a truncated ELF program header table".into()),
    }
  }
  Ok(())
}

fn hex(b: &[u8]) -> String {
  b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
  use super::*;

  /// A minimal ELF header (and one program header of type `ptype`).
  fn elf(machine: u16, etype: u16, ptype: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64 + 56];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[16..18].copy_from_slice(&etype.to_le_bytes());
    b[18..20].copy_from_slice(&machine.to_le_bytes());
    b[32..40].copy_from_slice(&64u64.to_le_bytes());
    b[54..56].copy_from_slice(&56u16.to_le_bytes());
    b[56..58].copy_from_slice(&1u16.to_le_bytes());
    b[64..68].copy_from_slice(&ptype.to_le_bytes());
    b
  }

  #[test]
  fn only_static_executables_for_the_named_machine_pass() {
    assert!(check_elf(&elf(62, 3, 1), Arch::X86_64).is_ok());
    assert!(check_elf(&elf(62, 2, 1), Arch::X86_64).is_ok());
    assert!(check_elf(&elf(183, 3, 1), Arch::Aarch64).is_ok());
    let e = check_elf(&elf(62, 3, 1), Arch::Aarch64).unwrap_err();
    assert!(e.contains("not aarch64"), "{e}");
    assert!(check_elf(&elf(62, 3, 3), Arch::X86_64)
      .unwrap_err()
      .contains("dynamically linked"));
    assert!(check_elf(&elf(62, 1, 1), Arch::X86_64).is_err());
    assert!(check_elf(b"#!/bin/sh\necho hi\n", Arch::X86_64).is_err());
    let mut truncated = elf(62, 3, 1);
    truncated[56..58].copy_from_slice(&9u16.to_le_bytes());
    assert!(check_elf(&truncated, Arch::X86_64).is_err());
  }

  #[test]
  fn image_architectures() {
    assert_eq!(Arch::of_image("amd64"), Some(Arch::X86_64));
    assert_eq!(Arch::of_image("arm64"), Some(Arch::Aarch64));
    assert_eq!(Arch::of_image("s390x"), None);
  }

  #[tokio::test]
  async fn a_directory_loads_once_with_a_stable_tag() {
    let dir = std::env::temp_dir().join(format!("tf-agent-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("trueforge-agent-x86_64"), elf(62, 3, 1)).unwrap();
    let b = load(&dir).await.unwrap();
    assert_eq!(b.binaries.len(), 1);
    assert!(b
      .tag
      .starts_with(&format!("{}-", trueforge_agent_proto::VERSION)));
    assert_eq!(b.tag.len(), trueforge_agent_proto::VERSION.len() + 13);
    assert_eq!(load(&dir).await.unwrap().tag, b.tag);
    std::fs::write(dir.join("trueforge-agent-aarch64"), elf(62, 3, 1)).unwrap();
    let e = load(&dir).await.unwrap_err();
    assert!(e.contains("trueforge-agent-aarch64"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(load(&dir)
      .await
      .unwrap_err()
      .contains("npm run build:agent"));
  }
}
