//! The bytes a client sends before its connection is decided: read in pieces, up to a cap,
//! and whatever follows the handshake handed on to the outbound side.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The most read at once while a handshake is incomplete.
const PIECE: usize = 8 * 1024;

#[derive(Debug, Default)]
pub(super) struct Intake {
  buf: Vec<u8>,
  pos: usize,
}

/// Why more could not be had.
#[derive(Debug)]
pub(super) enum Short {
  /// The cap is reached.
  Full,
  /// The client closed its side.
  Eof,
  Io(io::Error),
}

impl Intake {
  /// Reads once more, holding at most `cap` bytes in all.
  pub async fn more<S: AsyncRead + Unpin>(&mut self, io: &mut S, cap: usize) -> Result<(), Short> {
    let len = self.buf.len();
    if len >= cap {
      return Err(Short::Full);
    }
    self.buf.resize(len + PIECE.min(cap - len), 0);
    let got = io.read(&mut self.buf[len..]).await;
    let n = *got.as_ref().unwrap_or(&0);
    self.buf.truncate(len + n);
    match got {
      Ok(0) => Err(Short::Eof),
      Ok(_) => Ok(()),
      Err(e) => Err(Short::Io(e)),
    }
  }

  /// Reads until `n` unread bytes are held.
  pub async fn need<S: AsyncRead + Unpin>(
    &mut self,
    io: &mut S,
    n: usize,
    cap: usize,
  ) -> Result<(), Short> {
    while self.unread().len() < n {
      self.more(io, cap).await?;
    }
    Ok(())
  }

  pub fn unread(&self) -> &[u8] {
    &self.buf[self.pos..]
  }

  pub fn consume(&mut self, n: usize) {
    self.pos = (self.pos + n).min(self.buf.len());
  }

  /// What the client sent past its handshake, to go out before the piping starts.
  pub fn into_rest(mut self) -> Vec<u8> {
    self.buf.drain(..self.pos);
    self.buf.shrink_to_fit();
    self.buf
  }
}

#[cfg(test)]
mod tests {
  use tokio::io::AsyncWriteExt;

  use super::*;

  #[tokio::test]
  async fn reads_up_to_the_cap_and_keeps_the_rest() {
    let (mut a, mut b) = tokio::io::duplex(64);
    b.write_all(b"hello world").await.unwrap();
    let mut i = Intake::default();
    i.need(&mut a, 5, 100).await.unwrap();
    assert_eq!(i.unread(), b"hello world");
    i.consume(6);
    assert!(matches!(i.more(&mut a, 11).await, Err(Short::Full)));
    drop(b);
    assert!(matches!(i.more(&mut a, 100).await, Err(Short::Eof)));
    assert_eq!(i.into_rest(), b"world");
  }
}
