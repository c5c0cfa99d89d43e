//! TLS, on rustls with the ring provider: to an `https://` upstream
//! ([`UpstreamTls`]) and on the proxy's own listener ([`ServerTls`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its TLS handshake: a client that
/// stalls holds a task and a socket, never the accept loop.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A certificate, key or CA file that cannot be used; the message names
/// the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct TlsError {
    path: String,
    reason: String,
}

impl TlsError {
    fn new(path: &Path, reason: impl ToString) -> TlsError {
        TlsError {
            path: path.display().to_string(),
            reason: reason.to_string(),
        }
    }
}

/// How the proxy checks an `https://` upstream's certificate.
///
/// The default trusts Mozilla's roots (webpki-roots), as a browser would.
/// [`with_ca_file`](Self::with_ca_file) trusts a private CA instead;
/// [`insecure`](Self::insecure) checks nothing and is only ever chosen by
/// name.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
}

impl Default for UpstreamTls {
    fn default() -> UpstreamTls {
        UpstreamTls::mozilla()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn client_config(roots: RootCertStore) -> ClientConfig {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

impl UpstreamTls {
    /// Trusts Mozilla's roots: a public upstream's certificate.
    pub fn mozilla() -> UpstreamTls {
        let roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        UpstreamTls {
            config: Arc::new(client_config(roots)),
        }
    }

    /// Trusts the CA certificates in a PEM file, and only those: an
    /// upstream with a certificate from a private CA.
    pub fn with_ca_file(path: &Path) -> Result<UpstreamTls, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in certificates(path)? {
            roots.add(cert).map_err(|e| TlsError::new(path, e))?;
        }
        Ok(UpstreamTls {
            config: Arc::new(client_config(roots)),
        })
    }

    /// Checks no certificate at all: any server that answers on the
    /// upstream's address gets the requests, keys and bodies. For tests.
    pub fn insecure() -> UpstreamTls {
        let mut config = client_config(RootCertStore::empty());
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(AnyCertificate(provider())));
        UpstreamTls {
            config: Arc::new(config),
        }
    }

    pub(crate) fn client_config(&self) -> ClientConfig {
        (*self.config).clone()
    }
}

/// The certificates of a PEM file; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::new(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::new(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The verifier of [`UpstreamTls::insecure`]: any certificate, though the
/// handshake's signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
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

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The rustls error somewhere in `error`'s chain: the reason a handshake
/// failed, when it was TLS that failed.
pub(crate) fn tls_cause(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(error) = error.downcast_ref::<rustls::Error>() {
            return Some(describe(error));
        }
        // An `io::Error`'s own `source` skips the error it wraps, and
        // hyper-rustls wraps tokio-rustls's `io::Error` in another.
        next = match error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

/// A rustls error in plain words, its own text after them.
fn describe(error: &rustls::Error) -> String {
    let words = match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => "its certificate is not signed by a trusted CA",
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "its certificate has expired"
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "its certificate is not valid yet"
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "its certificate is not valid for the upstream's host name"
            }
            _ => "its certificate was refused",
        },
        _ => "the TLS handshake failed",
    };
    format!("{words} ({error})")
}

/// The certificate and key the proxy's listener presents, read from PEM
/// files and read again by [`reload`](Self::reload) (the command calls it
/// on `SIGHUP`). Connections already open keep the certificate they were
/// made with; new ones get the new one. Clones share the certificate.
#[derive(Debug, Clone)]
pub struct ServerTls {
    inner: Arc<ServerInner>,
}

#[derive(Debug)]
struct ServerInner {
    cert: PathBuf,
    key: PathBuf,
    config: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    /// Reads the certificate chain (the server's first) and its private
    /// key (PKCS #8, PKCS #1 or SEC1).
    pub fn from_pem_files(
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Result<ServerTls, TlsError> {
        let (cert, key) = (cert.into(), key.into());
        let config = server_config(&cert, &key)?;
        Ok(ServerTls {
            inner: Arc::new(ServerInner {
                cert,
                key,
                config: RwLock::new(Arc::new(config)),
            }),
        })
    }

    /// Reads the files again. New connections get the new certificate;
    /// on an error the old one stays in use, so a half-written file never
    /// takes the proxy down.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = server_config(&self.inner.cert, &self.inner.key)?;
        *self
            .inner
            .config
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The TLS handshake of one accepted connection, bounded in time.
    pub(crate) async fn accept(&self, stream: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let config = Arc::clone(
            &self
                .inner
                .config
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsAcceptor::from(config).accept(stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
    }
}

fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let chain = certificates(cert)?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::new(key, e))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| TlsError::new(key, e))?;
    // Clients may speak HTTP/2 or HTTP/1.1 over TLS, as over cleartext.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
