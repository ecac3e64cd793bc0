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
