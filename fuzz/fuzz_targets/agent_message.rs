//! Feeds arbitrary text to kvblast's agent-message parser (`agent::Message`: one line of
//! JSON from a peer over TCP, a job's result carrying counters and HdrHistogram V2
//! histograms): it must never panic or allocate beyond its bounds, and what it accepts must
//! encode to a line that parses again, of the same kind.
#![no_main]

use kvblast::agent::Message;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(message) = Message::parse(text) {
        let line = message.to_line();
        assert!(line.is_ok(), "an accepted message does not encode: {line:?}");
        let again = Message::parse(line.as_deref().unwrap_or_default().trim_end());
        assert!(
            matches!(&again, Ok(m) if m.kind() == message.kind()),
            "a re-encoded message is refused: {again:?}"
        );
    }
});
