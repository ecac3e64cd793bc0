//! Feeds arbitrary bytes to the authentication parsers the way the server does: the ASCII
//! handshake (`-Y`: a command line, then its data block), the SASL PLAIN message and the binary
//! header check made before authentication (`-S`). Checks that they never panic, that what they
//! consume is within the buffer and never 0, that what they wait for is bounded, and that a
//! PLAIN message's fields come from it.
#![no_main]

use kvproto::auth::{self, AuthData, AuthLine};
use kvproto::binary::{HEADER_LEN, MAX_HEAD_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // The ASCII handshake over the whole input.
    let mut rest = input;
    for _ in 0..=input.len() {
        match auth::parse_auth_line(rest) {
            AuthLine::Incomplete => {
                assert!(rest.len() <= auth::MAX_AUTH_LINE_WAIT);
                break;
            }
            AuthLine::Close => break,
            AuthLine::Unauthenticated { consumed } | AuthLine::TooLong { consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                rest = &rest[consumed..];
            }
            AuthLine::Data { consumed, len } => {
                assert!(consumed > 0 && consumed <= rest.len());
                assert!(len <= auth::MAX_AUTH_DATA_LEN);
                rest = &rest[consumed..];
                let block_len = len as usize + 2;
                let Some(block) = rest.get(..block_len) else {
                    break;
                };
                if let AuthData::Credentials { user, password } = auth::parse_auth_data(block) {
                    assert_eq!(user.len() + password.len() + 3, block.len());
                    assert!(!user.contains(&b' '));
                }
                rest = &rest[block_len..];
            }
        }
    }

    // SASL PLAIN.
    if let Some(p) = auth::parse_sasl_plain(input) {
        assert_eq!(
            p.authzid.len() + p.authcid.len() + p.password.len() + 2,
            input.len()
        );
        assert!(!p.authzid.contains(&0) && !p.authcid.contains(&0) && !p.password.contains(&0));
    }

    // The binary header check.
    if let Some(h) = auth::binary_head(input) {
        assert!(h.head_len() <= input.len() && h.head_len() <= MAX_HEAD_LEN);
        assert!(h.head_len() >= HEADER_LEN);
        assert!(h.extlen + h.keylen <= h.bodylen);
    }
});
