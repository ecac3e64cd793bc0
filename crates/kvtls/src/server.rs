//! The server's TLS settings as memcached spells them (`-o ssl_*`), the rustls configurations
//! built from them, and their reload (`refresh_certs`).
//!
//! memcached keeps one OpenSSL context for the process and lets a listener override peer
//! verification (`btls:` never asks for a client certificate, `mtls:` requires one). Here
//! each of those three policies is its own rustls `ServerConfig`, built from the same files;
//! [`ServerTls::refresh`] rebuilds all three and swaps them in, so connections accepted
//! afterwards use the new certificates and established ones keep theirs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache, StoresServerSessions};
use rustls::server::{ServerConfig, ServerConnection};
use rustls::sign::{CertifiedKey, SigningKey, SingleCertAndKey};
use rustls::RootCertStore;

use crate::verify::ClientVerifier;
use crate::Error;

/// memcached's `ssl_verify_mode`: whether and how client certificates are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// 0: no client certificate is asked for.
    #[default]
    None,
    /// 1: one is asked for and checked if given; clients without one are served.
    Request,
    /// 2: one is required.
    Require,
    /// 3: one is required (OpenSSL's "once" only matters on renegotiation, which neither
    /// memcached nor rustls allows).
    Once,
}

impl VerifyMode {
    /// From memcached's number (0-3).
    pub fn from_number(n: u32) -> Option<VerifyMode> {
        Some(match n {
            0 => VerifyMode::None,
            1 => VerifyMode::Request,
            2 => VerifyMode::Require,
            3 => VerifyMode::Once,
            _ => return None,
        })
    }

    /// memcached's number, as `stats settings` prints it.
    pub fn number(self) -> u32 {
        match self {
            VerifyMode::None => 0,
            VerifyMode::Request => 1,
            VerifyMode::Require => 2,
            VerifyMode::Once => 3,
        }
    }

    /// The value of OpenSSL's flags memcached prints in `stats settings` (`ssl_verify_mode`):
    /// SSL_VERIFY_PEER 1, FAIL_IF_NO_PEER_CERT 2, CLIENT_ONCE 4.
    pub fn openssl_flags(self) -> u32 {
        match self {
            VerifyMode::None => 0,
            VerifyMode::Request => 1,
            VerifyMode::Require => 3,
            VerifyMode::Once => 7,
        }
    }
}

/// The oldest protocol version accepted (`ssl_min_version`). rustls speaks TLS 1.2 and 1.3
/// only; memcached's 0 (TLS 1.0) and 1 (TLS 1.1) are refused by the option parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinVersion {
    #[default]
    Tls12,
    Tls13,
}

impl MinVersion {
    /// As memcached names it in `stats settings`.
    pub fn name(self) -> &'static str {
        match self {
            MinVersion::Tls12 => "tlsv1.2",
            MinVersion::Tls13 => "tlsv1.3",
        }
    }
}

/// How the private key file is encoded (`ssl_keyformat`: OpenSSL's SSL_FILETYPE_PEM 1 or
/// SSL_FILETYPE_ASN1 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyFormat {
    #[default]
    Pem,
    Der,
}

/// The TLS settings (`-o ssl_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `ssl_chain_cert`: the server's certificate chain, PEM.
    pub chain_cert: Option<PathBuf>,
    /// `ssl_key`: its private key (the chain file when not given, as in memcached).
    pub key: Option<PathBuf>,
    pub key_format: KeyFormat,
    /// `ssl_ca_cert`: the CAs client certificates must chain to, PEM.
    pub ca_cert: Option<PathBuf>,
    pub verify_mode: VerifyMode,
    pub min_version: MinVersion,
    /// `ssl_ciphers`: an OpenSSL cipher list; restricts TLS 1.2 suites (as OpenSSL's
    /// cipher list does; TLS 1.3 suites are always offered).
    pub ciphers: Option<String>,
    /// `ssl_session_cache`: resumption with a server-side session cache.
    pub session_cache: bool,
}

/// A listener's peer-verification policy (`-l` prefixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// As `ssl_verify_mode` says.
    Default,
    /// `btls:`: never ask for a client certificate.
    Never,
    /// `mtls:`: require one.
    Require,
}

/// The certificates and key read from the files.
pub struct Material {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<dyn SigningKey>,
    roots: Option<Arc<RootCertStore>>,
}

/// The crypto provider: ring (no C toolchain beyond `cc`, no OpenSSL).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Read a PEM certificate list (at least one certificate).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect();
    let certs = certs.map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(Error::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Read the server's certificate chain: PEM certificates of any X.509 version (OpenSSL serves
/// version 1 certificates; webpki, which rustls would check them with, takes version 3 only),
/// each of which must at least be shaped as a certificate.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = read_certs(path)?;
    for (i, cert) in certs.iter().enumerate() {
        crate::x509::outline(cert).map_err(|e| Error::Certificate {
            path: path.to_path_buf(),
            index: i + 1,
            source: Box::new(e),
        })?;
    }
    Ok(certs)
}

fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> Error {
    let path = path.to_path_buf();
    match e {
        rustls::pki_types::pem::Error::Io(source) => Error::Io { path, source },
        other => Error::Pem {
            path,
            detail: format!("{other:?}"),
        },
    }
}

/// The first private key of a PEM file, whatever its label says it is.
struct PemKey {
    kind: SectionKind,
    der: Vec<u8>,
}

impl PemObject for PemKey {
    fn from_pem(kind: SectionKind, der: Vec<u8>) -> Option<Self> {
        match kind {
            SectionKind::PrivateKey | SectionKind::RsaPrivateKey | SectionKind::EcPrivateKey => {
                Some(PemKey { kind, der })
            }
            _ => None,
        }
    }
}

/// Load a private key from its DER, trying PKCS#8, PKCS#1 and SEC1 in turn, the one the PEM
/// label names (`hint`) first. OpenSSL loads a PKCS#8 key under an `RSA PRIVATE KEY` or `EC
/// PRIVATE KEY` label (some tools write them so); here the label does not matter at all.
/// The error is the provider's, for the encoding the label named (PKCS#8 without one).
fn decode_key(der: Vec<u8>, hint: Option<SectionKind>) -> Result<Arc<dyn SigningKey>, Error> {
    let provider = rustls::crypto::ring::default_provider();
    let order: [fn(Vec<u8>) -> PrivateKeyDer<'static>; 3] = match hint {
        Some(SectionKind::RsaPrivateKey) => [pkcs1, pkcs8, sec1],
        Some(SectionKind::EcPrivateKey) => [sec1, pkcs8, pkcs1],
        _ => [pkcs8, pkcs1, sec1],
    };
    let mut first_error = None;
    for make in order {
        match provider.key_provider.load_private_key(make(der.clone())) {
            Ok(key) => return Ok(key),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(Error::NotAKey(first_error))
}

fn pkcs8(der: Vec<u8>) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(der.into())
}
fn pkcs1(der: Vec<u8>) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs1(der.into())
}
fn sec1(der: Vec<u8>) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Sec1(der.into())
}

fn read_key(path: &Path, format: KeyFormat) -> Result<Arc<dyn SigningKey>, Error> {
    let (der, hint) = match format {
        KeyFormat::Pem => {
            let key = PemKey::from_pem_file(path).map_err(|e| pem_error(path, e))?;
            (key.der, Some(key.kind))
        }
        KeyFormat::Der => (
            std::fs::read(path).map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?,
            None,
        ),
    };
    decode_key(der, hint).map_err(|e| Error::KeyFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// That `key` is the private key of `chain`'s first certificate (OpenSSL's
/// `SSL_CTX_check_private_key`), compared by public key, as rustls compares them but for a
/// certificate of any version. A key that cannot tell its public key passes, as in rustls.
pub(crate) fn check_key(chain: &[CertificateDer<'_>], key: &dyn SigningKey) -> Result<(), Error> {
    let Some(public) = key.public_key() else {
        return Ok(());
    };
    let cert = chain.first().ok_or(Error::EmptyChain)?;
    let outline = crate::x509::outline(cert)?;
    if outline.spki == public.as_ref() {
        Ok(())
    } else {
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch).into())
    }
}

/// Read the files the settings name, with memcached's messages for what fails.
pub fn load(settings: &Settings) -> Result<Material, Error> {
    let chain_path = settings.chain_cert.as_deref().ok_or(Error::NoChainCert)?;
    let chain = read_chain(chain_path).map_err(|e| Error::Chain {
        path: chain_path.to_path_buf(),
        source: Box::new(e),
    })?;
    let key_path = settings.key.as_deref().unwrap_or(chain_path);
    let key = read_key(key_path, settings.key_format).map_err(|e| Error::Key {
        path: key_path.to_path_buf(),
        source: Box::new(e),
    })?;
    check_key(&chain, key.as_ref()).map_err(|e| Error::Validate(Box::new(e)))?;
    let roots = match &settings.ca_cert {
        None => None,
        Some(path) => {
            let fail = |e: Error| Error::Ca {
                path: path.clone(),
                source: Box::new(e),
            };
            let mut store = RootCertStore::empty();
            for cert in read_certs(path).map_err(fail)? {
                store.add(cert).map_err(|e| fail(Error::CaCertificate(e)))?;
            }
            Some(Arc::new(store))
        }
    };
    Ok(Material { chain, key, roots })
}

/// The TLS 1.2 suites an OpenSSL cipher list keeps. Names are OpenSSL's
/// (`ECDHE-RSA-AES128-GCM-SHA256`) or IANA's (`TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`);
/// `ALL`, `HIGH`, `DEFAULT`, `ECDHE`, `AESGCM`, `CHACHA20` keep every suite rustls has;
/// exclusions (`!x`, `-x`) and strength keywords are ignored. An error when nothing is kept,
/// as OpenSSL fails when no cipher matches.
pub fn tls12_suites(
    list: &str,
    all: &[rustls::SupportedCipherSuite],
) -> Result<Vec<rustls::SupportedCipherSuite>, Error> {
    let mut keep: Vec<rustls::SupportedCipherSuite> = Vec::new();
    let mut add = |s: rustls::SupportedCipherSuite| {
        if !keep.iter().any(|k| k.suite() == s.suite()) {
            keep.push(s);
        }
    };
    for token in list.split([':', ',', ' ']).filter(|t| !t.is_empty()) {
        if token.starts_with(['!', '-', '+', '@']) {
            continue;
        }
        let upper = token.to_ascii_uppercase();
        let everything = matches!(
            upper.as_str(),
            "ALL" | "HIGH" | "DEFAULT" | "ECDHE" | "EECDH" | "AESGCM" | "CHACHA20" | "TLSV1.2"
        );
        for s in all
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
        {
            let iana = format!("{:?}", s.suite());
            if everything || iana == upper || openssl_name(&iana).as_deref() == Some(&upper) {
                add(*s);
            }
        }
    }
    if keep.is_empty() {
        return Err(Error::Ciphers(list.to_string()));
    }
    Ok(keep)
}

/// Check an `ssl_ciphers` list against the suites this build offers (at startup, before the
/// files are read).
pub fn check_ciphers(list: &str) -> Result<(), Error> {
    tls12_suites(
        list,
        &rustls::crypto::ring::default_provider().cipher_suites,
    )
    .map(|_| ())
}

/// OpenSSL's name of a TLS 1.2 ECDHE suite from its IANA name:
/// `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256` → `ECDHE-RSA-AES128-GCM-SHA256`.
fn openssl_name(iana: &str) -> Option<String> {
    let rest = iana.strip_prefix("TLS_ECDHE_")?;
    let (auth, cipher) = rest.split_once("_WITH_")?;
    let cipher = cipher
        .replace("AES_128_", "AES128-")
        .replace("AES_256_", "AES256-")
        .replace("CHACHA20_POLY1305_SHA256", "CHACHA20-POLY1305")
        .replace('_', "-");
    Some(format!("ECDHE-{auth}-{cipher}"))
}

/// Build the configuration for one peer policy from what was read.
pub fn build(
    material: &Material,
    settings: &Settings,
    peer: Peer,
    sessions: Arc<dyn StoresServerSessions>,
) -> Result<Arc<ServerConfig>, Error> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(list) = &settings.ciphers {
        let tls12 = tls12_suites(list, &provider.cipher_suites)?;
        provider
            .cipher_suites
            .retain(|s| s.version() == &rustls::version::TLS13 || tls12.contains(s));
    }
    let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version {
        MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let provider = Arc::new(provider);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(Error::Versions)?;
    let verify = match peer {
        Peer::Never => VerifyMode::None,
        Peer::Require => VerifyMode::Require,
        Peer::Default => settings.verify_mode,
    };
    let builder = match verify {
        VerifyMode::None => builder.with_no_client_auth(),
        // Without `ssl_ca_cert` every certificate sent is refused (`unknown ca`), as OpenSSL
        // refuses with an empty trust store; under 2 and 3 so is every client without one:
        // memcached starts so, and the server warns that it serves no one.
        mode => builder.with_client_cert_verifier(Arc::new(ClientVerifier::new(
            material.roots.clone(),
            provider,
            mode != VerifyMode::Request,
        )?)),
    };
    // The key was checked against the certificate when read (`load`); rustls's own check
    // (`with_single_cert`) would refuse a version 1 certificate, which OpenSSL serves.
    let certified = CertifiedKey::new(material.chain.clone(), material.key.clone());
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.session_storage = sessions;
    if !settings.session_cache {
        // No resumption at all, as memcached with its session cache off.
        config.send_tls13_tickets = 0;
    }
    // memcached refuses renegotiation; rustls never does it. Nothing to set.
    Ok(Arc::new(config))
}

/// Build one configuration straight from DER (tests and fuzzing).
pub fn config_from_der(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    settings: &Settings,
    peer: Peer,
) -> Result<Arc<ServerConfig>, Error> {
    let key = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(Error::KeyDer)?;
    let material = Material {
        chain,
        key,
        roots: None,
    };
    build(
        &material,
        settings,
        peer,
        Arc::new(NoServerSessionStorage {}),
    )
}

/// memcached's TLS counters (`stats`: `ssl_handshake_errors`, `ssl_proto_errors`,
/// `ssl_new_sessions`) and kvcached's own (`ssl_handshake_timeouts`).
#[derive(Debug, Default)]
pub struct Counters {
    pub handshake_errors: AtomicU64,
    pub proto_errors: AtomicU64,
    pub new_sessions: AtomicU64,
    pub handshake_timeouts: AtomicU64,
}

/// The server-side session cache, counting the sessions it stores (`ssl_new_sessions`).
struct CountingCache {
    inner: Arc<ServerSessionMemoryCache>,
    counters: Arc<Counters>,
}

impl fmt::Debug for CountingCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CountingCache")
    }
}

impl StoresServerSessions for CountingCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let stored = self.inner.put(key, value);
        if stored {
            self.counters.new_sessions.fetch_add(1, Ordering::Relaxed);
        }
        stored
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key)
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(key)
    }
    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// Sessions OpenSSL's server cache holds by default (SSL_SESSION_CACHE_MAX_SIZE_DEFAULT).
const SESSION_CACHE_SIZE: usize = 20 * 1024;

/// The configurations in use, one per peer policy.
struct Configs {
    default: Arc<ServerConfig>,
    never: Arc<ServerConfig>,
    require: Arc<ServerConfig>,
}

/// The server's TLS: its settings, the configurations built from them, the counters.
pub struct ServerTls {
    settings: Settings,
    configs: RwLock<Configs>,
    sessions: Arc<dyn StoresServerSessions>,
    pub counters: Arc<Counters>,
}

impl ServerTls {
    /// Read the files and build every configuration; the error is memcached's message.
    pub fn new(settings: Settings) -> Result<ServerTls, Error> {
        let counters = Arc::new(Counters::default());
        let sessions: Arc<dyn StoresServerSessions> = if settings.session_cache {
            Arc::new(CountingCache {
                inner: ServerSessionMemoryCache::new(SESSION_CACHE_SIZE),
                counters: counters.clone(),
            })
        } else {
            Arc::new(NoServerSessionStorage {})
        };
        let configs = Self::configs(&settings, &sessions)?;
        Ok(ServerTls {
            settings,
            configs: RwLock::new(configs),
            sessions,
            counters,
        })
    }

    fn configs(
        settings: &Settings,
        sessions: &Arc<dyn StoresServerSessions>,
    ) -> Result<Configs, Error> {
        let material = load(settings)?;
        let default = build(&material, settings, Peer::Default, sessions.clone())?;
        let never = build(&material, settings, Peer::Never, sessions.clone())?;
        let require = build(&material, settings, Peer::Require, sessions.clone())?;
        Ok(Configs {
            default,
            never,
            require,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Re-read the certificate, key and CA files (`refresh_certs`). On failure the
    /// configurations in use stay, and the error is memcached's message.
    pub fn refresh(&self) -> Result<(), Error> {
        let fresh = Self::configs(&self.settings, &self.sessions)?;
        let mut configs = self.configs.write().map_err(|_| Error::Poisoned)?;
        *configs = fresh;
        Ok(())
    }

    /// A new server-side session for a connection accepted on a listener with `peer`.
    pub fn accept(&self, peer: Peer) -> Result<ServerConnection, Error> {
        let config = {
            let configs = self.configs.read().map_err(|_| Error::Poisoned)?;
            match peer {
                Peer::Default => configs.default.clone(),
                Peer::Never => configs.never.clone(),
                Peer::Require => configs.require.clone(),
            }
        };
        Ok(ServerConnection::new(config)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openssl_names_map_to_suites() {
        assert_eq!(
            openssl_name("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256").as_deref(),
            Some("ECDHE-RSA-AES128-GCM-SHA256")
        );
        assert_eq!(
            openssl_name("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256").as_deref(),
            Some("ECDHE-ECDSA-CHACHA20-POLY1305")
        );
        let all = rustls::crypto::ring::default_provider().cipher_suites;
        let one = tls12_suites("ECDHE-RSA-AES256-GCM-SHA384", &all).expect("known");
        assert_eq!(one.len(), 1);
        let many = tls12_suites("HIGH:!aNULL:!MD5", &all).expect("keyword");
        assert!(many.len() > 1);
        assert!(tls12_suites("RC4-MD5", &all).is_err());
    }

    /// A temporary directory for one test, removed when dropped.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let dir = std::env::temp_dir().join(format!("kvtls-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("dir");
            Dir(dir)
        }
        fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, bytes).expect("write");
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// PKCS#8 and SEC1 keys load under any private-key PEM label, and as DER; what is no key
    /// at all still gives memcached's "Error loading the key".
    #[test]
    fn keys_load_whatever_their_pem_label_says() {
        let dir = Dir::new("labels");
        let ck = crate::testcert::self_signed("localhost");
        let cert = dir.write("cert.pem", ck.cert_pem().as_bytes());
        let pkcs8 = ck.key_der_bytes();
        let sec1 = ck.key_sec1_der();
        let mut s = Settings {
            chain_cert: Some(cert),
            ..Settings::default()
        };
        for (body, what) in [(&pkcs8, "pkcs8"), (&sec1, "sec1")] {
            for label in ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"] {
                let pem = crate::testcert::pem(label, body);
                s.key = Some(dir.write("key.pem", pem.as_bytes()));
                s.key_format = KeyFormat::Pem;
                let tls = ServerTls::new(s.clone());
                assert!(tls.is_ok(), "{what} under {label}: {:?}", tls.err());
            }
            s.key = Some(dir.write("key.der", body));
            s.key_format = KeyFormat::Der;
            let tls = ServerTls::new(s.clone());
            assert!(tls.is_ok(), "{what} as DER: {:?}", tls.err());
        }
        // Garbage under a key label, and as DER.
        let pem = crate::testcert::pem("RSA PRIVATE KEY", b"\x30\x03\x02\x01\x00");
        s.key = Some(dir.write("bad.pem", pem.as_bytes()));
        s.key_format = KeyFormat::Pem;
        let e = ServerTls::new(s.clone())
            .err()
            .expect("not a key")
            .to_string();
        assert!(e.starts_with("Error loading the key: "), "{e}");
        s.key = Some(dir.write("bad.der", b"not a key"));
        s.key_format = KeyFormat::Der;
        let e = ServerTls::new(s).err().expect("not a key").to_string();
        assert!(e.starts_with("Error loading the key: "), "{e}");
    }

    /// A version 1 certificate is served (its key still checked against it); a PEM
    /// certificate whose contents are not a certificate gives memcached's message.
    #[test]
    fn version_1_certificates_load_and_malformed_ones_do_not() {
        let dir = Dir::new("v1");
        let ca = crate::testcert::Ca::new("v1 CA");
        let v1 = ca.issue_v1("localhost");
        assert_eq!(crate::x509::outline(&v1.cert).expect("outline").version, 1);
        let mut s = Settings {
            chain_cert: Some(dir.write("cert.pem", v1.cert_pem().as_bytes())),
            key: Some(dir.write("key.pem", v1.key_pem().as_bytes())),
            ..Settings::default()
        };
        let tls = ServerTls::new(s.clone()).expect("a v1 certificate is served");
        assert!(tls.accept(Peer::Default).is_ok());
        // The same checks as for any certificate: a key that is not its own is refused.
        let other = ca.issue_v1("localhost");
        s.key = Some(dir.write("other.pem", other.key_pem().as_bytes()));
        let e = ServerTls::new(s.clone())
            .err()
            .expect("mismatch")
            .to_string();
        assert!(e.starts_with("Error validating the certificate: "), "{e}");
        // A CERTIFICATE block that holds no certificate.
        let junk = crate::testcert::pem("CERTIFICATE", b"\x30\x03\x02\x01\x00");
        s.chain_cert = Some(dir.write("junk.pem", junk.as_bytes()));
        let e = ServerTls::new(s.clone()).err().expect("junk").to_string();
        assert!(
            e.starts_with("Error loading the certificate chain: ") && e.contains("not an X.509"),
            "{e}"
        );
        // A junk certificate after a good one in the chain file.
        let chain = format!("{}{junk}", v1.cert_pem());
        s.chain_cert = Some(dir.write("chain.pem", chain.as_bytes()));
        s.key = Some(dir.write("key.pem", v1.key_pem().as_bytes()));
        let e = ServerTls::new(s)
            .err()
            .expect("junk in the chain")
            .to_string();
        assert!(e.contains("certificate 2: not an X.509"), "{e}");
    }

    /// Every `ssl_verify_mode` builds without `ssl_ca_cert`, and so does every listener
    /// policy (memcached starts with each): under 1 a client without a certificate is
    /// served, under 2, 3 and `mtls:` none is.
    #[test]
    fn every_verify_mode_builds_without_a_ca() {
        let dir = Dir::new("no-ca");
        let ck = crate::testcert::self_signed("localhost");
        let mut s = Settings {
            chain_cert: Some(dir.write("cert.pem", ck.cert_pem().as_bytes())),
            key: Some(dir.write("key.pem", ck.key_pem().as_bytes())),
            ..Settings::default()
        };
        for (mode, required) in [
            (VerifyMode::None, None),
            (VerifyMode::Request, Some(false)),
            (VerifyMode::Require, Some(true)),
            (VerifyMode::Once, Some(true)),
        ] {
            s.verify_mode = mode;
            let tls = ServerTls::new(s.clone()).expect("starts without a CA");
            let client = crate::client::config_from_roots(std::slice::from_ref(&ck.ca), None)
                .expect("client");
            // Whether a client without a certificate is served, on a listener with `peer`.
            let served = |peer| {
                let configs = tls.configs.read().expect("configs");
                let config = match peer {
                    Peer::Default => configs.default.clone(),
                    Peer::Never => configs.never.clone(),
                    Peer::Require => configs.require.clone(),
                };
                crate::testpair::handshake(config, client.clone()).is_ok()
            };
            assert_eq!(served(Peer::Default), required != Some(true), "{mode:?}");
            assert!(served(Peer::Never), "{mode:?}: btls:");
            assert!(!served(Peer::Require), "{mode:?}: mtls:");
            for peer in [Peer::Default, Peer::Never, Peer::Require] {
                assert!(tls.accept(peer).is_ok());
            }
        }
    }

    #[test]
    fn missing_and_bad_files_give_memcacheds_messages() {
        let dir = std::env::temp_dir().join(format!("kvtls-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut s = Settings {
            chain_cert: Some(dir.join("missing.pem")),
            ..Settings::default()
        };
        let e = load(&s).err().expect("missing").to_string();
        assert!(
            e.starts_with("Error loading the certificate chain: "),
            "{e}"
        );
        let ck = crate::testcert::self_signed("localhost");
        let cert = dir.join("cert.pem");
        std::fs::write(&cert, ck.cert_pem()).expect("write");
        s.chain_cert = Some(cert.clone());
        let e = load(&s)
            .err()
            .expect("no key in the chain file")
            .to_string();
        assert!(e.starts_with("Error loading the key: "), "{e}");
        let key = dir.join("key.pem");
        std::fs::write(&key, ck.key_pem()).expect("write");
        s.key = Some(key.clone());
        assert!(ServerTls::new(s.clone()).is_ok());
        // A key that is not the certificate's.
        let other = crate::testcert::self_signed("other");
        std::fs::write(&key, other.key_pem()).expect("write");
        let e = ServerTls::new(s.clone())
            .err()
            .expect("mismatch")
            .to_string();
        assert!(e.starts_with("Error validating the certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
