//! A matched pair of rustls configurations for tests and fuzzing (feature `testcert`): kept
//! apart from `testcert`, which the settings' own tests use, so that no module imports one
//! that imports it back.

/// Panics only in tests: building a configuration from a fresh certificate does not fail.
fn must<T, E: std::fmt::Debug>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("test configuration: {e:?}"),
    }
}

/// A server configuration (default settings) with a certificate for `name`, and a client
/// configuration that trusts it.
pub fn configs(
    name: &str,
) -> (
    std::sync::Arc<rustls::ServerConfig>,
    std::sync::Arc<rustls::ClientConfig>,
) {
    let ck = crate::testcert::self_signed(name);
    let server = must(crate::server::config_from_der(
        vec![ck.cert.clone()],
        ck.key_der(),
        &crate::server::Settings::default(),
        crate::server::Peer::Default,
    ));
    let client = must(crate::client::config_from_roots(
        std::slice::from_ref(&ck.ca),
        None,
    ));
    (server, client)
}

/// A full handshake between `server` and `client` (for `localhost`), in memory: the server's
/// error if it refused the client.
pub fn handshake(
    server: std::sync::Arc<rustls::ServerConfig>,
    client: std::sync::Arc<rustls::ClientConfig>,
) -> Result<(), rustls::Error> {
    let name = must(rustls::pki_types::ServerName::try_from("localhost"));
    let mut s = rustls::ServerConnection::new(server)?;
    let mut c = rustls::ClientConnection::new(client, name)?;
    for _ in 0..16 {
        let mut wire = Vec::new();
        while c.wants_write() {
            must(c.write_tls(&mut wire));
        }
        must(s.read_tls(&mut wire.as_slice()));
        s.process_new_packets()?;
        wire.clear();
        while s.wants_write() {
            must(s.write_tls(&mut wire));
        }
        must(c.read_tls(&mut wire.as_slice()));
        // The client's own error only repeats the server's alert.
        let _ = c.process_new_packets();
        if !s.is_handshaking() && !c.is_handshaking() {
            return Ok(());
        }
    }
    Err(rustls::Error::General(
        "the handshake did not finish".into(),
    ))
}
