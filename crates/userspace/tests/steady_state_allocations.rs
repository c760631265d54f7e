//! No allocation in the engine per packet: two user-space tunnels in this process, peers of
//! each other over loopback (no privileges needed), carry one TCP stream both ways at full
//! speed, and after a warm-up a counting global allocator must see no allocation on either
//! engine thread while 32 MiB (some 24,000 packets) cross each way.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunneld_userspace::{PeerSettings, PrivateKey, Tunnel, TunnelSettings};

/// Counts allocations made on the threads in `COUNTED` while `MEASURING` is set.
struct Counting;

static MEASURING: AtomicBool = AtomicBool::new(false);
/// Thread ids (the kernel's) of the threads whose allocations count; 0: none.
static COUNTED: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// A sample of what was allocated: the size of the last allocation counted.
static LAST_SIZE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's id, once asked for (0 until then).
    static TID: Cell<i32> = const { Cell::new(0) };
}

fn count(layout: Layout) {
    if !MEASURING.load(Ordering::Relaxed) {
        return;
    }
    let tid = TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::gettid() });
        }
        t.get()
    });
    if COUNTED.iter().any(|c| c.load(Ordering::Relaxed) == tid) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LAST_SIZE.store(layout.size(), Ordering::Relaxed);
    }
}

// SAFETY: defers every call to the system allocator; the bookkeeping touches only atomics
// and a const-initialised thread local, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout);
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(layout);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The kernel's ids of this process's engine threads (named `tunneld-userspace`, which the
/// kernel keeps as its first 15 bytes).
fn engine_threads() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == "tunneld-userspa")
        })
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

fn settings(key: &PrivateKey, address: &str, peer: &PrivateKey, peer_ip: &str) -> TunnelSettings {
    TunnelSettings::new(key.clone())
        .listen("127.0.0.1:0".parse().unwrap())
        .address(address.parse().unwrap())
        .peer(PeerSettings::new(peer.public_key()).allowed_ip(peer_ip.parse().unwrap()))
}

/// Bytes each way: a warm-up, then the measured window, then the rest.
const WARM_UP: u64 = 16 << 20;
const MEASURED: u64 = 32 << 20;
const TOTAL: u64 = 64 << 20;

#[test]
fn the_engine_carries_a_bulk_stream_both_ways_without_allocating() {
    // The counter must see allocations, or a zero below would prove nothing.
    // SAFETY: gettid has no preconditions.
    COUNTED[0].store(unsafe { libc::gettid() }, Ordering::Relaxed);
    MEASURING.store(true, Ordering::SeqCst);
    drop(std::hint::black_box(vec![1u8; 64]));
    MEASURING.store(false, Ordering::SeqCst);
    COUNTED[0].store(0, Ordering::Relaxed);
    assert!(ALLOCATIONS.swap(0, Ordering::SeqCst) >= 1);

    let (a_key, b_key) = (PrivateKey::generate(), PrivateKey::generate());
    let a = Tunnel::start(settings(&a_key, "10.78.0.1/24", &b_key, "10.78.0.2/32")).unwrap();
    let mut b_settings = settings(&b_key, "10.78.0.2/24", &a_key, "10.78.0.1/32");
    b_settings.peers[0].endpoint = Some(a.local_addr());
    let b = Tunnel::start(b_settings).unwrap();
    // A new thread takes its name a moment after it starts.
    let mut engines = engine_threads();
    for _ in 0..200 {
        if engines.len() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        engines = engine_threads();
    }
    assert_eq!(engines.len(), 2, "two engine threads: {engines:?}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let allocations = rt.block_on(async {
        let listener = a.tcp_listen("10.78.0.1:9".parse().unwrap()).await.unwrap();
        let (near, far) = tokio::join!(async { listener.accept().await.unwrap().0 }, async {
            b.tcp_connect("10.78.0.1:9").await.unwrap()
        },);
        // Bytes received so far, on each side.
        let received = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let mut tasks = tokio::task::JoinSet::new();
        for (side, stream) in [near, far].into_iter().enumerate() {
            let (mut r, mut w) = stream.into_split();
            tasks.spawn(async move {
                let chunk = vec![side as u8; 64 << 10];
                let mut left = TOTAL;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    w.write_all(&chunk[..n]).await.unwrap();
                    left -= n as u64;
                }
                w.shutdown().await.unwrap();
            });
            let received = received.clone();
            tasks.spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = r.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    assert!(buf[..n].iter().all(|&x| x == 1 - side as u8));
                    received[side].fetch_add(n as u64, Ordering::Relaxed);
                }
                assert_eq!(received[side].load(Ordering::Relaxed), TOTAL);
            });
        }
        let both_past = |n: u64| received.iter().all(|r| r.load(Ordering::Relaxed) >= n);
        let wait_past = |n: u64| async move {
            tokio::time::timeout(Duration::from_secs(120), async {
                while !both_past(n) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("the stream moves");
        };
        wait_past(WARM_UP).await;
        for (slot, tid) in COUNTED.iter().zip(&engines) {
            slot.store(*tid, Ordering::Relaxed);
        }
        MEASURING.store(true, Ordering::SeqCst);
        wait_past(WARM_UP + MEASURED).await;
        MEASURING.store(false, Ordering::SeqCst);
        let allocations = ALLOCATIONS.load(Ordering::SeqCst);
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        allocations
    });
    let stats = a.stats();
    assert!(
        stats.rx_bytes > TOTAL && stats.tx_bytes > TOTAL,
        "{stats:?}"
    );
    assert_eq!(
        allocations,
        0,
        "allocations on the engine threads while {} MiB crossed each way (the last of {} bytes)",
        MEASURED >> 20,
        LAST_SIZE.load(Ordering::Relaxed)
    );
    a.shutdown();
    b.shutdown();
}
