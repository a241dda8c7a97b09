//! Mutual TLS: which client certificates the server accepts. webpki checks
//! that the CA of `--tls-client-ca` signed the certificate; then, with
//! `--tls-client-san`, the certificate must carry that name.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DistinguishedName, RootCertStore};

use super::certificate::{TlsError, invalid, read};
use super::verifier::{check_name, webpki_signature_checks};

/// The verifier of client certificates signed by the CA certificates in
/// `ca_path` (PEM) and, when `san` is set, carrying that name.
pub(super) fn client_verifier(
    ca_path: &Path,
    san: Option<&str>,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let ca = read(ca_path)?;
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&ca) {
        let certificate = certificate.map_err(|err| invalid(ca_path, err))?;
        roots
            .add(certificate)
            .map_err(|err| invalid(ca_path, err))?;
    }
    let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|err| invalid(ca_path, err))?;
    let san = san
        .map(|san| {
            ServerName::try_from(san.to_owned())
                .map_err(|err| invalid(Path::new("--tls-client-san"), err))
        })
        .transpose()?;
    Ok(Arc::new(SanVerifier { webpki, san }))
}

/// webpki's client verification, then the required name, if any.
#[derive(Debug)]
struct SanVerifier {
    webpki: Arc<dyn ClientCertVerifier>,
    san: Option<ServerName<'static>>,
}

impl ClientCertVerifier for SanVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Some(san) = &self.san {
            check_name(end_entity, san)?;
        }
        Ok(verified)
    }

    webpki_signature_checks!(webpki);
}
