//! Where workers run: the CPUs this process may use, those on the NUMA node of the network
//! device that carries the tunnel's datagrams first, so that packets and the cores handling
//! them share a memory node.

use std::net::{IpAddr, SocketAddr, UdpSocket};

/// The CPUs the process may run on (its affinity mask, which `taskset` or a cgroup may
/// narrow), in ascending order; empty if the kernel will not say.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size into it for
    // the calling thread (pid 0), and CPU_ISSET only reads inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

/// `cpus` with those on `node` first, each part in its given order.
pub fn placement(
    cpus: &[usize],
    node: Option<usize>,
    node_of: impl Fn(usize) -> Option<usize>,
) -> Vec<usize> {
    let (mut near, far): (Vec<usize>, Vec<usize>) = cpus
        .iter()
        .partition(|&&cpu| node.is_some() && node_of(cpu) == node);
    near.extend(far);
    near
}

/// The NUMA node of a CPU, from sysfs (`/sys/devices/system/cpu/cpuN/nodeM`).
pub fn cpu_node(cpu: usize) -> Option<usize> {
    std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{cpu}"))
        .ok()?
        .flatten()
        .find_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
}

/// The NUMA node of the network device that datagrams to `endpoint` leave by: the route
/// is looked up by connecting a UDP socket (which sends nothing), the device is the one
/// holding the chosen source address, and its node is in sysfs. `None` for a virtual
/// device (no node) or when anything is unknown.
pub fn underlay_node(endpoint: SocketAddr) -> Option<usize> {
    let device = underlay_interface(endpoint)?;
    let node: i64 = std::fs::read_to_string(format!("/sys/class/net/{device}/device/numa_node"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    usize::try_from(node).ok() // -1: the platform does not say
}

/// The interface traffic to `endpoint` leaves by: the one holding the source address the
/// kernel picks for it (a connected UDP socket's route lookup; nothing is sent).
pub fn underlay_interface(endpoint: SocketAddr) -> Option<String> {
    let any: SocketAddr = match endpoint {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let probe = UdpSocket::bind(any).ok()?;
    probe.connect(endpoint).ok()?;
    let source = probe.local_addr().ok()?.ip();
    interface_with_address(source)
}

/// The name of the interface that has address `ip`.
pub fn interface_with_address(ip: IpAddr) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list it allocates, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed; its
        // address, when not null, is a sockaddr of the family it names, and its name a C string.
        let (addr, name) = unsafe { ((*entry).ifa_addr, (*entry).ifa_name) };
        // SAFETY: as above.
        let address = unsafe { sockaddr_ip(addr) };
        if address == Some(ip) && !name.is_null() {
            // SAFETY: as above.
            let name = unsafe { std::ffi::CStr::from_ptr(name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
        // SAFETY: as above.
        entry = unsafe { (*entry).ifa_next };
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// The IP address in a sockaddr, for IPv4 and IPv6.
///
/// # Safety
/// `addr` is null or points to a sockaddr whose full size matches its family.
unsafe fn sockaddr_ip(addr: *const libc::sockaddr) -> Option<IpAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees the sockaddr is valid for its family.
    unsafe {
        match i32::from((*addr).sa_family) {
            libc::AF_INET => {
                let v4 = &*(addr as *const libc::sockaddr_in);
                Some(IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes()))
            }
            libc::AF_INET6 => {
                let v6 = &*(addr as *const libc::sockaddr_in6);
                Some(IpAddr::from(v6.sin6_addr.s6_addr))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_on_the_underlay_node_come_first() {
        let node_of = |cpu: usize| Some(cpu % 2); // CPUs alternate between two nodes
        assert_eq!(placement(&[0, 1, 2, 3], Some(1), node_of), [1, 3, 0, 2]);
        assert_eq!(placement(&[0, 1, 2, 3], None, node_of), [0, 1, 2, 3]);
        assert_eq!(placement(&[0, 1, 2, 3], Some(7), node_of), [0, 1, 2, 3]);
    }

    #[test]
    fn this_machine_answers() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        if std::path::Path::new("/sys/devices/system/node").exists() {
            assert!(cpu_node(cpus[0]).is_some(), "CPU {} has a node", cpus[0]);
        }
        // Loopback: found by its address, and virtual, so no node.
        assert_eq!(
            interface_with_address("127.0.0.1".parse().unwrap()).as_deref(),
            Some("lo")
        );
        assert_eq!(underlay_node("127.0.0.1:9".parse().unwrap()), None);
    }
}
