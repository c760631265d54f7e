//! What [`Tunnel::tcp_connect`](crate::Tunnel::tcp_connect) takes: an address, or a name
//! and a port.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A destination inside the tunnel: a [`SocketAddr`], `(IpAddr, u16)`, `"10.77.0.2:80"`,
/// `"[fd77::2]:80"`, or a name and a port, `("db.internal", 5432)` or
/// `"db.internal:5432"` (resolved through the tunnel's DNS servers). Sealed: the forms
/// above are all.
///
/// ```
/// use tunneld_userspace::ToTunnelAddr;
/// fn takes(_: impl ToTunnelAddr) {}
/// takes("10.77.0.2:80");
/// takes(("db.internal", 5432));
/// takes("[fd77::2]:7".parse::<std::net::SocketAddr>().unwrap());
/// ```
pub trait ToTunnelAddr: sealed::Sealed {
    /// The host (an address or a name) and the port.
    #[doc(hidden)]
    fn host_port(&self) -> io::Result<(String, u16)>;
}

mod sealed {
    pub trait Sealed {}
}

impl sealed::Sealed for SocketAddr {}
impl ToTunnelAddr for SocketAddr {
    fn host_port(&self) -> io::Result<(String, u16)> {
        Ok((self.ip().to_string(), self.port()))
    }
}

macro_rules! ip_and_port {
    ($($ip:ty),*) => {$(
        impl sealed::Sealed for ($ip, u16) {}
        impl ToTunnelAddr for ($ip, u16) {
            fn host_port(&self) -> io::Result<(String, u16)> {
                Ok((self.0.to_string(), self.1))
            }
        }
    )*};
}
ip_and_port!(IpAddr, Ipv4Addr, Ipv6Addr);

impl sealed::Sealed for (&str, u16) {}
impl ToTunnelAddr for (&str, u16) {
    fn host_port(&self) -> io::Result<(String, u16)> {
        Ok((self.0.to_string(), self.1))
    }
}

impl sealed::Sealed for (String, u16) {}
impl ToTunnelAddr for (String, u16) {
    fn host_port(&self) -> io::Result<(String, u16)> {
        Ok((self.0.clone(), self.1))
    }
}

/// `host:port`, the host an address (`[…]` around IPv6) or a name.
fn split(text: &str) -> io::Result<(String, u16)> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok((addr.ip().to_string(), addr.port()));
    }
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{text:?} is not host:port"),
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
    let port = port.parse().map_err(|_| invalid())?;
    if host.is_empty() || host.contains(':') {
        return Err(invalid());
    }
    Ok((host.to_string(), port))
}

impl sealed::Sealed for &str {}
impl ToTunnelAddr for &str {
    fn host_port(&self) -> io::Result<(String, u16)> {
        split(self)
    }
}

impl sealed::Sealed for String {}
impl ToTunnelAddr for String {
    fn host_port(&self) -> io::Result<(String, u16)> {
        split(self)
    }
}

impl sealed::Sealed for &String {}
impl ToTunnelAddr for &String {
    fn host_port(&self) -> io::Result<(String, u16)> {
        split(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_gives_its_host_and_port() {
        assert_eq!(
            "10.77.0.2:80".host_port().unwrap(),
            ("10.77.0.2".into(), 80)
        );
        assert_eq!("[fd77::2]:7".host_port().unwrap(), ("fd77::2".into(), 7));
        assert_eq!(
            "db.internal:5432".host_port().unwrap(),
            ("db.internal".into(), 5432)
        );
        assert_eq!(
            ("db.internal", 5432).host_port().unwrap(),
            ("db.internal".into(), 5432)
        );
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!((ip, 9).host_port().unwrap(), ("10.0.0.1".into(), 9));
        for bad in [
            "db.internal",
            ":80",
            "fd77::2:80",
            "host:port",
            "host:70000",
        ] {
            let e = bad.host_port().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }
}
