//! Where workers run: the CPUs this process may use, in order.

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
