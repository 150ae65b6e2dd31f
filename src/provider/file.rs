//! `file:///dir`: writes each mail as an RFC 5322 `.eml` file, for development.
//!
//! A file is named after the mail's `Message-ID`, so a retried request overwrites its
//! earlier copy instead of adding one. It is written to a temporary file first and then
//! renamed, so a reader never sees half a mail.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use super::{ErrorClass, Provider, ProviderUrlError, SendError};
use crate::message::Mail;

/// Writes each mail into a directory.
#[derive(Debug)]
pub struct FileProvider {
    dir: PathBuf,
}

impl FileProvider {
    /// Takes `file:///absolute/dir`, creating the directory when it does not exist.
    pub fn from_url(url: &url::Url) -> Result<Self, ProviderUrlError> {
        super::refuse_query(url, &[])?;
        let dir = url.to_file_path().map_err(|()| {
            ProviderUrlError::invalid(
                url,
                "a file URL names an absolute directory on this machine, like file:///var/mail/out",
            )
        })?;
        Self::new(dir).map_err(|problem| ProviderUrlError::invalid(url, problem))
    }

    /// Writes into `dir`, creating it when it does not exist.
    pub fn new(dir: PathBuf) -> Result<Self, String> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the directory {}: {e}", dir.display()))?;
        Ok(Self { dir })
    }

    /// The directory mail is written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn write(&self, mail: Mail) -> Result<(), SendError> {
        let path = self.dir.join(file_name(mail.message_id()));
        let rendered = mail.render().map_err(|e| super::unrenderable(self, &e))?;
        let target = path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&target, rendered.parts()))
            .await
            .map_err(|e| {
                SendError::for_now(ErrorClass::Io, format!("writing {}: {e}", path.display()))
            })?
            .map_err(|e| {
                SendError::for_now(ErrorClass::Io, format!("writing {}: {e}", path.display()))
            })
    }
}

impl fmt::Display for FileProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file://{}", self.dir.display())
    }
}

impl Provider for FileProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(self.write(mail))
    }
}

/// The `.eml` file name of a mail: its `Message-ID` without the angle brackets, with
/// anything that is not safe in a file name replaced by `_`.
pub fn file_name(message_id: &str) -> String {
    let id = message_id.trim_start_matches('<').trim_end_matches('>');
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@' | '+' | '=') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // A leading dot would hide the file, and temporary files start with one.
    format!("{}.eml", safe.trim_start_matches('.'))
}

/// Writes `contents` to a temporary file next to `path`, then renames it into place.
fn write_atomically(
    path: &Path,
    contents: impl IntoIterator<Item = impl AsRef<[u8]>>,
) -> std::io::Result<()> {
    static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::File::create(&temp).and_then(|mut file| {
        for piece in contents {
            file.write_all(piece.as_ref())?;
        }
        file.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&temp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_come_from_the_message_id_and_are_safe() {
        assert_eq!(
            file_name("<order-42@shop.example>"),
            "order-42@shop.example.eml"
        );
        assert_eq!(file_name("<../../etc/passwd@x>"), "_.._etc_passwd@x.eml");
        assert_eq!(file_name("<a/b\\c d@x>"), "a_b_c_d@x.eml");
    }
}
