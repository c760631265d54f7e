//! Bytes both ways between a local connection and one through the tunnel, through a bounded
//! buffer each way. Each side's end of stream becomes a shutdown of the other's writing
//! (half-close), so protocols that end their request with a FIN work; an error either way
//! ends both.

use super::{Counters, RELAY_BUFFER};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Relays until both directions have ended (or one failed). `local` is the side on this
/// host, `tunnel` the one through the tunnel (for the byte counters).
pub(super) async fn relay<L, T>(local: L, tunnel: T, counters: &Counters)
where
    L: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let (mut local_read, mut local_write) = tokio::io::split(local);
    let (mut tunnel_read, mut tunnel_write) = tokio::io::split(tunnel);
    let up = copy(&mut local_read, &mut tunnel_write, &counters.to_tunnel);
    let down = copy(&mut tunnel_read, &mut local_write, &counters.from_tunnel);
    if let Err(e) = tokio::try_join!(up, down) {
        tracing::debug!("proxy: relay ended: {e}");
    }
}

async fn copy<R, W>(from: &mut R, to: &mut W, counter: &AtomicU64) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}
