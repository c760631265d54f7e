use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use zeroize::Zeroizing;

/// Why a key file could not be used. Messages name the problem, never the key.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")]
    WorldReadable { path: String, mode: u32 },
    #[error("{path} is larger than a key file can be")]
    TooLarge { path: String },
}

impl KeyFileError {
    /// What is wrong, without the file's name, for a message that names the file (and its
    /// field) itself.
    pub fn reason(&self) -> String {
        match self {
            KeyFileError::Read { source, .. } => source.to_string(),
            KeyFileError::WorldReadable { mode, .. } => {
                format!("readable by group or others (mode {mode:03o}); chmod 600 it")
            }
            KeyFileError::TooLarge { .. } => "larger than a key file can be".into(),
        }
    }
}

/// Reads a key file's text (trimmed), refusing files that group or others may read or write,
/// as `wg` warns about. The content stays in zeroizing memory.
pub fn read_key_file(path: &Path) -> Result<Zeroizing<String>, KeyFileError> {
    // A key is 44 characters; allow a newline and some whitespace but refuse anything huge.
    let bytes = read_secret_file(path, 256)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| KeyFileError::Read {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Ok(Zeroizing::new(text.trim().to_string()))
}

/// Reads a file that holds a secret (a WireGuard key, a private key in PEM) of fewer than
/// `limit` bytes, refusing it when group or others may read or write it: the mode is that
/// of the file opened, so it cannot change between the check and the read. The content
/// stays in zeroizing memory.
pub fn read_secret_file(path: &Path, limit: u64) -> Result<Zeroizing<Vec<u8>>, KeyFileError> {
    let shown = path.display().to_string();
    let read_err = |source| KeyFileError::Read {
        path: shown.clone(),
        source,
    };
    let mut file = File::open(path).map_err(read_err)?;
    let mode = file.metadata().map_err(read_err)?.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::WorldReadable { path: shown, mode });
    }
    let mut bytes = Zeroizing::new(Vec::new());
    file.by_ref()
        .take(limit)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 >= limit {
        return Err(KeyFileError::TooLarge { path: shown });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn write_key(mode: u32, content: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(content.as_bytes()).unwrap();
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        file
    }

    #[test]
    fn reads_private_file() {
        let file = write_key(0o600, "  abc=\n");
        assert_eq!(read_key_file(file.path()).unwrap().as_str(), "abc=");
    }

    #[test]
    fn refuses_loose_permissions() {
        let file = write_key(0o644, "abc=");
        let err = read_key_file(file.path()).unwrap_err().to_string();
        assert!(err.contains("readable by others"), "{err}");
        assert!(err.contains("644"), "{err}");
    }

    #[test]
    fn refuses_huge_files_and_missing_files() {
        let file = write_key(0o600, &"A".repeat(10_000));
        assert!(matches!(
            read_key_file(file.path()),
            Err(KeyFileError::TooLarge { .. })
        ));
        let err = read_key_file(Path::new("/nonexistent/key"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("cannot read /nonexistent/key"), "{err}");
    }
}
