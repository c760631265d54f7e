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

/// Reads a key file's text (trimmed), refusing files that group or others may read or write,
/// as `wg` warns about. The content stays in zeroizing memory.
pub fn read_key_file(path: &Path) -> Result<Zeroizing<String>, KeyFileError> {
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
    let mut text = Zeroizing::new(String::new());
    // A key is 44 characters; allow a newline and some whitespace but refuse anything huge.
    file.by_ref()
        .take(256)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    if text.len() >= 256 {
        return Err(KeyFileError::TooLarge { path: shown });
    }
    Ok(Zeroizing::new(text.trim().to_string()))
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
