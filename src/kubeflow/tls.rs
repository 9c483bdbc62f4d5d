//! The endpoint's certificate and the files CMD reads: a CA made at start whose key
//! signs one certificate (for `127.0.0.1` and `localhost`) and is then dropped, so no
//! other certificate can ever chain to it; the CA's certificate, and a random token,
//! in exec's private directory (mode 0700), the token readable by its owner alone.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use ring::rand::SecureRandom;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::KubeflowError;

/// The CA certificate's file name, in the directory given.
pub const CA_FILE: &str = "kubeflow-ca.crt";
/// The token's file name, in the directory given.
pub const TOKEN_FILE: &str = "kubeflow-token";

/// What the server needs, and where CMD finds its side.
pub struct Material {
    pub config: Arc<rustls::ServerConfig>,
    pub token: String,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
}

/// Makes the CA, the server's certificate and the token, and writes the CA's
/// certificate and the token into `dir`.
pub fn make(dir: &Path) -> Result<Material, KubeflowError> {
    let cert = |e: rcgen::Error| KubeflowError::Certificate(e.to_string());
    let ca_key = KeyPair::generate().map_err(cert)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(cert)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "trainlet exec: Kubeflow progress CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).map_err(cert)?.pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(cert)?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).map_err(cert)?;
    leaf.subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    leaf.distinguished_name
        .push(DnType::CommonName, "trainlet exec: Kubeflow progress");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf.signed_by(&key, &issuer).map_err(cert)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeflowError::Certificate(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(leaf.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| KubeflowError::Certificate(e.to_string()))?;
    // As Trainer's server: HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];

    let token = random_token()?;
    let ca_file = dir.join(CA_FILE);
    let token_file = dir.join(TOKEN_FILE);
    write(&ca_file, ca_pem.as_bytes(), 0o644)?;
    write(&token_file, token.as_bytes(), 0o600)?;
    Ok(Material {
        config: Arc::new(config),
        token,
        ca_file,
        token_file,
    })
}

/// 32 random bytes, base64url.
fn random_token() -> Result<String, KubeflowError> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| KubeflowError::Certificate("no randomness for the token".into()))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// A new file of `mode`: never one that was there (a link CMD left would redirect it).
fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), KubeflowError> {
    let err = |source| KubeflowError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_token_is_its_owners_alone_and_the_ca_a_pem_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let m = make(dir.path()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&m.token_file), 0o600);
        assert_eq!(std::fs::read_to_string(&m.token_file).unwrap(), m.token);
        assert_eq!(m.token.len(), 43);
        let ca = std::fs::read_to_string(&m.ca_file).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        // Made once: a second start in the same directory refuses to reuse the files.
        assert!(matches!(make(dir.path()), Err(KubeflowError::Write { .. })));
    }
}
