//! The client side: what kvblast and a replica's link to its master use to connect over TLS.

use std::path::PathBuf;
use std::sync::Arc;

use crate::Error;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// A client's TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// CA certificates (PEM) the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// A client certificate chain (PEM) and its key, for servers that ask for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name to check the server's certificate against (default: the host connected to).
    pub server_name: Option<String>,
    /// Accept any server certificate (benchmarks against a test server only).
    pub insecure: bool,
}

impl Settings {
    /// Build the rustls configuration: the files are read now.
    pub fn config(&self) -> Result<Arc<ClientConfig>, Error> {
        let client_auth = match (&self.cert, &self.key) {
            (Some(cert), key) => {
                let chain = crate::server::read_certs(cert)?;
                let key_path = key.as_ref().unwrap_or(cert);
                let key =
                    rustls::pki_types::pem::PemObject::from_pem_file(key_path).map_err(|e| {
                        Error::Pem {
                            path: key_path.clone(),
                            detail: format!("{e:?}"),
                        }
                    })?;
                Some((chain, key))
            }
            (None, Some(_)) => return Err(Error::KeyWithoutCertificate),
            (None, None) => None,
        };
        if self.insecure {
            let provider = crate::server::provider();
            let builder = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
            return finish(builder, client_auth);
        }
        let ca = self.ca.as_ref().ok_or(Error::NoCa)?;
        let roots = crate::server::read_certs(ca)?;
        config_from_roots(&roots, client_auth)
    }

    /// The name to present and check: the configured one, else `host`.
    pub fn name_for(&self, host: &str) -> Result<ServerName<'static>, Error> {
        let name = self.server_name.as_deref().unwrap_or(host);
        ServerName::try_from(name.to_string()).map_err(|source| Error::ServerName {
            name: name.to_string(),
            source,
        })
    }

    /// A new client session with `config` for `host`.
    pub fn connect(
        &self,
        config: &Arc<ClientConfig>,
        host: &str,
    ) -> Result<ClientConnection, Error> {
        Ok(ClientConnection::new(config.clone(), self.name_for(host)?)?)
    }
}

type ClientAuth = Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>;

fn finish(
    builder: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
    client_auth: ClientAuth,
) -> Result<Arc<ClientConfig>, Error> {
    let config = match client_auth {
        // Not `with_client_auth_cert`, whose check that the key is the certificate's reads
        // the certificate with webpki (version 3 only): the same check, for any version, as
        // the server makes of its own (OpenSSL clients present version 1 certificates too).
        Some((chain, key)) => {
            let key = crate::server::provider()
                .key_provider
                .load_private_key(key)
                .map_err(Error::ClientCertificate)?;
            crate::server::check_key(&chain, key.as_ref()).map_err(|e| match e {
                Error::Rustls(e) => Error::ClientCertificate(e),
                other => other,
            })?;
            let certified = CertifiedKey::new(chain, key);
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(certified)))
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A configuration trusting `roots`, with an optional client certificate.
pub fn config_from_roots(
    roots: &[CertificateDer<'static>],
    client_auth: ClientAuth,
) -> Result<Arc<ClientConfig>, Error> {
    let mut store = RootCertStore::empty();
    for cert in roots {
        store.add(cert.clone()).map_err(Error::CaCertificate)?;
    }
    let builder = ClientConfig::builder_with_provider(crate::server::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(store);
    finish(builder, client_auth)
}

/// Accepts every server certificate, still checking the handshake's signatures.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
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
