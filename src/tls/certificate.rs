//! The server's certificate: its chain and key read from their files and
//! checked to belong together, and the pair in use, replaced whole when
//! the files change. Every error names the file.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("TLS: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("TLS: {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The bytes of a certificate file and its key file.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Files {
    pub(super) fn read(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read(cert)?,
            key: read(key)?,
        })
    }
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key bytes never go to a log.
        f.write_str("Files")
    }
}

/// The bytes of `path`.
pub(super) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// `path` holds nothing usable, for `reason`.
pub(super) fn invalid(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::Invalid {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Reads the pair at `cert` and `key`: their bytes and the key they make.
pub(super) fn read_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<(Files, CertifiedKey), TlsError> {
    let files = Files::read(cert, key)?;
    let certified = certified_key(&files, cert, key, provider)?;
    Ok((files, certified))
}

/// The chain and key in `files` (read from `cert_path` and `key_path`),
/// checked to belong together.
pub(super) fn certified_key(
    files: &Files,
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&files.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(cert_path, err))?;
    if chain.is_empty() {
        return Err(invalid(cert_path, "no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|err| invalid(key_path, err))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|err| invalid(key_path, err))
}

/// The certificate in use, replaced whole on reload: every handshake takes
/// the one in use when it starts, without a lock.
#[derive(Debug)]
pub(super) struct ReloadingCertificate {
    current: ArcSwap<CertifiedKey>,
}

impl ReloadingCertificate {
    pub(super) fn new(key: CertifiedKey) -> Self {
        Self {
            current: ArcSwap::from_pointee(key),
        }
    }

    pub(super) fn replace(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}
