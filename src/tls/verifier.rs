//! What our certificate verifiers share: the server's client-certificate
//! verifier (`client_auth`) and the Redis client's pinning verifier
//! (`store::pinned_tls`) each decide on a certificate in their own way, and
//! both leave the handshake's signatures to webpki and check a name the
//! same way.

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, Error};

/// Writes, inside an `impl` of rustls's `ClientCertVerifier` or
/// `ServerCertVerifier`, the three methods that check the handshake's
/// signatures and list the schemes they can check: each passes through to
/// the webpki verifier held in the field `$webpki`.
macro_rules! webpki_signature_checks {
    ($webpki:ident) => {
        $crate::tls::verifier::webpki_signature_checks!(
            @pass $webpki: verify_tls12_signature, verify_tls13_signature
        );

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.$webpki.supported_verify_schemes()
        }
    };
    // TLS 1.2's and 1.3's checks differ only in their names.
    (@pass $webpki:ident: $($verify:ident),+) => {
        $(
            fn $verify(
                &self,
                message: &[u8],
                cert: &rustls::pki_types::CertificateDer<'_>,
                dss: &rustls::DigitallySignedStruct,
            ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
                self.$webpki.$verify(message, cert, dss)
            }
        )+
    };
}

pub(crate) use webpki_signature_checks;

/// Whether `end_entity` carries `name` (DNS or IP) among its subject
/// alternative names; the error rustls reports when it does not.
pub(crate) fn check_name(
    end_entity: &CertificateDer<'_>,
    name: &ServerName<'_>,
) -> Result<(), Error> {
    let certificate = webpki::EndEntityCert::try_from(end_entity)
        .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    certificate
        .verify_is_valid_for_subject_name(name)
        .map_err(|_| Error::InvalidCertificate(CertificateError::NotValidForName))
}
