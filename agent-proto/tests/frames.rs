//! Frames survive any split of the byte stream, and a decoder never accepts more than the caps.

use bytes::BytesMut;
use proptest::prelude::*;
use trueforge_agent_proto::frame::{decode, Frame, FrameError, Kind, MAX_PAYLOAD};

fn kind() -> impl Strategy<Value = Kind> {
  prop_oneof![
    Just(Kind::Hello),
    Just(Kind::Open),
    Just(Kind::Head),
    Just(Kind::Data),
    Just(Kind::End),
    Just(Kind::Credit),
    Just(Kind::Result),
    Just(Kind::Cancel),
  ]
}

fn frame() -> impl Strategy<Value = Frame> {
  (
    kind(),
    any::<u32>(),
    prop::collection::vec(any::<u8>(), 0..2000),
  )
    .prop_map(|(k, id, p)| Frame::new(k, id, p))
}

proptest! {
  #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

  #[test]
  fn frames_round_trip_across_any_split(frames in prop::collection::vec(frame(), 0..20), cuts in prop::collection::vec(1usize..700, 1..30)) {
    let mut wire = BytesMut::new();
    for f in &frames {
      f.encode(&mut wire);
    }
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    let mut rest = &wire[..];
    let mut i = 0;
    while !rest.is_empty() {
      let n = cuts[i % cuts.len()].min(rest.len());
      buf.extend_from_slice(&rest[..n]);
      rest = &rest[n..];
      i += 1;
      while let Some(f) = decode(&mut buf).unwrap() {
        got.push(f);
      }
    }
    prop_assert!(buf.is_empty());
    prop_assert_eq!(got, frames);
  }

  #[test]
  fn garbage_is_a_frame_or_an_error_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
    let mut buf = BytesMut::from(&bytes[..]);
    loop {
      match decode(&mut buf) {
        Ok(Some(f)) => prop_assert!(f.payload.len() <= MAX_PAYLOAD),
        Ok(None) => break,
        Err(FrameError::TooLarge { len }) => {
          prop_assert!(len > MAX_PAYLOAD);
          break;
        }
        Err(FrameError::UnknownKind(k)) => {
          prop_assert!(k == 0 || k > 8);
          break;
        }
      }
    }
  }
}
