//! The Unix socket: inherited from systemd (`LISTEN_FDS`, socket activation) or bound here
//! with the configured mode and group.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::config::Config;

/// The socket the HTTP API is served on.
pub struct Socket {
    /// The listener.
    pub listener: tokio::net::UnixListener,
    /// The path we bound (removed at exit); `None` for an inherited socket.
    pub bound_path: Option<PathBuf>,
    /// For logs and systemd's status.
    pub description: String,
}

/// The socket systemd passed us, else one bound at `config.socket`.
pub fn unix_listener(config: &Config) -> anyhow::Result<Socket> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() > 0 {
        let listener = fds
            .take_unix_listener(0)
            .context("the socket systemd passed (LISTEN_FDS) is not a Unix stream socket")?
            .context("systemd passed no socket")?;
        listener.set_nonblocking(true)?;
        let description =
            match listener.local_addr().ok().and_then(|a| a.as_pathname().map(Path::to_path_buf)) {
                Some(p) => format!("{} (from systemd)", p.display()),
                None => "a socket from systemd".to_owned(),
            };
        return Ok(Socket {
            listener: tokio::net::UnixListener::from_std(listener)?,
            bound_path: None,
            description,
        });
    }
    let path = &config.socket;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    if path.exists() {
        // A socket nobody answers on is left over from a daemon that did not stop cleanly.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use: another pocketd is listening there", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(config.socket_mode.0))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    if let Some(group) = &config.socket_group {
        let gid = group_id(group)?;
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {group}", path.display()))?;
    }
    listener.set_nonblocking(true)?;
    Ok(Socket {
        listener: tokio::net::UnixListener::from_std(listener)?,
        bound_path: Some(path.clone()),
        description: path.display().to_string(),
    })
}

/// The id of group `name` (or a number), from `/etc/group`.
fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = name.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    groups
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            Some((f.next()?, f.nth(1)?))
        })
        .find(|(n, _)| *n == name)
        .and_then(|(_, gid)| gid.parse().ok())
        .with_context(|| format!("socket_group = {name:?}: no such group in /etc/group"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_resolve_by_name_or_number() {
        assert_eq!(super::group_id("root").unwrap(), 0);
        assert_eq!(super::group_id("1234").unwrap(), 1234);
        assert!(super::group_id("no-such-group-pocketd").unwrap_err().to_string().contains("no such group"));
    }
}
