//! A CA and certificates made for one test (`tests/test_ca.py`, Python's cryptography),
//! and the test SMTP server speaking TLS with them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::smtp::{SmtpServer, TempDir};

/// The CA's files (removed with the directory): `ca.pem`, and for each leaf (`server`,
/// `expired`, `wrong-name`) `<leaf>.pem` and `<leaf>.key`.
pub struct TestCa(TempDir);

impl TestCa {
    pub fn generate() -> Self {
        let dir = TempDir::new("ca");
        let script = crate::repo_root().join("tests/test_ca.py");
        let status = Command::new("python3")
            .arg(script)
            .arg(&dir.0)
            .status()
            .expect("python3 runs tests/test_ca.py");
        assert!(
            status.success(),
            "tests/test_ca.py needs Python's cryptography"
        );
        Self(dir)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.0.join(name)
    }

    /// A server speaking TLS (`starttls` or `implicit`) with the certificate `leaf`.
    pub fn server(&self, mode: &str, leaf: &str) -> SmtpServer {
        let (cert, key) = (
            self.file(&format!("{leaf}.pem")),
            self.file(&format!("{leaf}.key")),
        );
        SmtpServer::start_tls([Path::new(mode), &cert, &key])
    }
}
