//! eBPF without a toolchain: a tiny instruction encoder and the few bpf(2) commands tunneld
//! uses (maps, program load, test run, XDP links, program info), through `libc::syscall`.
//!
//! The layouts below are the prefixes of the kernel's `union bpf_attr` (and `struct
//! bpf_prog_info`) that these commands read, from include/uapi/linux/bpf.h. The kernel takes
//! a shorter attribute than its own and treats the rest as zero, so only the fields used are
//! declared. Every pointer handed to the kernel comes from a slice this module checked the
//! length of, which is what keeps the safe functions safe.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

// ---------------------------------------------------------------------------------------------
// Instructions

/// Registers. R0: return value and helper result; R1–R5: helper arguments (clobbered by a
/// call); R6–R9: kept across calls; R10: the read-only frame pointer (512 bytes of stack below).
pub const R0: u8 = 0;
pub const R1: u8 = 1;
pub const R2: u8 = 2;
pub const R3: u8 = 3;
pub const R4: u8 = 4;
pub const R5: u8 = 5;
pub const R6: u8 = 6;
pub const R7: u8 = 7;
pub const R8: u8 = 8;
pub const R9: u8 = 9;
pub const R10: u8 = 10;

// Instruction classes, sizes, modes and operations (linux/bpf_common.h, linux/bpf.h).
const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_STX: u8 = 0x03;
const CLASS_JMP: u8 = 0x05;
const CLASS_ALU64: u8 = 0x07;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const SRC_K: u8 = 0x00;
const SRC_X: u8 = 0x08;
const ALU_ADD: u8 = 0x00;
const ALU_AND: u8 = 0x50;
const ALU_MOV: u8 = 0xb0;
const JMP_JA: u8 = 0x00;
const JMP_JEQ: u8 = 0x10;
const JMP_JGT: u8 = 0x20;
const JMP_JNE: u8 = 0x50;
const JMP_CALL: u8 = 0x80;
const JMP_EXIT: u8 = 0x90;
/// `src_reg` of a 64-bit immediate load whose immediate is a map's file descriptor.
const PSEUDO_MAP_FD: u8 = 1;

/// Memory access widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// 1 byte (`BPF_B`).
    B = 0x10,
    /// 2 bytes (`BPF_H`).
    H = 0x08,
    /// 4 bytes (`BPF_W`).
    W = 0x00,
    /// 8 bytes (`BPF_DW`).
    DW = 0x18,
}

/// One eBPF instruction, `struct bpf_insn`: opcode, destination and source registers (4 bits
/// each), a 16-bit offset and a 32-bit immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        debug_assert!(dst <= 10 && src <= 10);
        // The C bit-fields `dst_reg:4, src_reg:4` are allocated from the low bits on a
        // little-endian target and from the high bits on a big-endian one.
        #[cfg(target_endian = "little")]
        let regs = (src << 4) | (dst & 0x0f);
        #[cfg(target_endian = "big")]
        let regs = (dst << 4) | (src & 0x0f);
        Insn {
            code,
            regs,
            off,
            imm,
        }
    }

    pub fn dst(&self) -> u8 {
        if cfg!(target_endian = "little") {
            self.regs & 0x0f
        } else {
            self.regs >> 4
        }
    }

    pub fn src(&self) -> u8 {
        if cfg!(target_endian = "little") {
            self.regs >> 4
        } else {
            self.regs & 0x0f
        }
    }
}

/// `dst = imm` (64-bit register, immediate sign-extended).
pub fn mov_imm(dst: u8, imm: i32) -> Insn {
    Insn::new(CLASS_ALU64 | ALU_MOV | SRC_K, dst, 0, 0, imm)
}

/// `dst = src`.
pub fn mov_reg(dst: u8, src: u8) -> Insn {
    Insn::new(CLASS_ALU64 | ALU_MOV | SRC_X, dst, src, 0, 0)
}

/// `dst += imm`.
pub fn add_imm(dst: u8, imm: i32) -> Insn {
    Insn::new(CLASS_ALU64 | ALU_ADD | SRC_K, dst, 0, 0, imm)
}

/// `dst &= imm`.
pub fn and_imm(dst: u8, imm: i32) -> Insn {
    Insn::new(CLASS_ALU64 | ALU_AND | SRC_K, dst, 0, 0, imm)
}

/// `dst = *(size *)(src + off)`, zero-extended.
pub fn load(size: Size, dst: u8, src: u8, off: i16) -> Insn {
    Insn::new(CLASS_LDX | MODE_MEM | size as u8, dst, src, off, 0)
}

/// `*(size *)(dst + off) = src`.
pub fn store(size: Size, dst: u8, off: i16, src: u8) -> Insn {
    Insn::new(CLASS_STX | MODE_MEM | size as u8, dst, src, off, 0)
}

/// `dst = map` as the two-slot 64-bit immediate load the kernel rewrites into the map's
/// address (`BPF_LD | BPF_DW | BPF_IMM` with `src_reg = BPF_PSEUDO_MAP_FD`).
pub fn load_map_fd(dst: u8, map: BorrowedFd<'_>) -> [Insn; 2] {
    [
        Insn::new(
            CLASS_LD | MODE_IMM | Size::DW as u8,
            dst,
            PSEUDO_MAP_FD,
            0,
            map.as_raw_fd(),
        ),
        Insn::new(0, 0, 0, 0, 0),
    ]
}

/// `call helper` (arguments in R1–R5, result in R0).
pub fn call(helper: i32) -> Insn {
    Insn::new(CLASS_JMP | JMP_CALL, 0, 0, 0, helper)
}

/// `exit` (returns R0).
pub fn exit() -> Insn {
    Insn::new(CLASS_JMP | JMP_EXIT, 0, 0, 0, 0)
}

/// Conditions of the jumps the assembler emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// Always (`ja`).
    Always,
    /// `dst == imm`.
    EqImm(u8, i32),
    /// `dst != imm`.
    NeImm(u8, i32),
    /// `dst > src`, unsigned.
    GtReg(u8, u8),
}

/// A jump target, made by [`Asm::label`] and placed by [`Asm::bind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// A program being assembled: instructions plus jumps to labels, resolved by [`Asm::finish`].
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }

    /// Appends instructions.
    pub fn emit(&mut self, insns: impl IntoIterator<Item = Insn>) -> &mut Asm {
        self.insns.extend(insns);
        self
    }

    /// A new label, not yet placed.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Places `label` at the next instruction.
    pub fn bind(&mut self, label: Label) -> &mut Asm {
        debug_assert!(self.labels[label.0].is_none(), "label placed twice");
        self.labels[label.0] = Some(self.insns.len());
        self
    }

    /// `if cond goto label`.
    pub fn jump(&mut self, cond: Cond, label: Label) -> &mut Asm {
        let insn = match cond {
            Cond::Always => Insn::new(CLASS_JMP | JMP_JA, 0, 0, 0, 0),
            Cond::EqImm(dst, imm) => Insn::new(CLASS_JMP | JMP_JEQ | SRC_K, dst, 0, 0, imm),
            Cond::NeImm(dst, imm) => Insn::new(CLASS_JMP | JMP_JNE | SRC_K, dst, 0, 0, imm),
            Cond::GtReg(dst, src) => Insn::new(CLASS_JMP | JMP_JGT | SRC_X, dst, src, 0, 0),
        };
        self.fixups.push((self.insns.len(), label));
        self.insns.push(insn);
        self
    }

    /// The instructions, every jump's offset filled in (relative to the next instruction).
    pub fn finish(mut self) -> io::Result<Vec<Insn>> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0]
                .ok_or_else(|| io::Error::other(format!("label {} never placed", label.0)))?;
            let off = target as i64 - at as i64 - 1;
            self.insns[at].off = i16::try_from(off)
                .map_err(|_| io::Error::other(format!("jump too far ({off})")))?;
        }
        Ok(self.insns)
    }
}

// ---------------------------------------------------------------------------------------------
// The bpf(2) system call

const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_LOOKUP_ELEM: u32 = 1;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_MAP_DELETE_ELEM: u32 = 3;
const BPF_MAP_GET_NEXT_KEY: u32 = 4;
const BPF_PROG_LOAD: u32 = 5;
const BPF_PROG_TEST_RUN: u32 = 10;
const BPF_PROG_GET_FD_BY_ID: u32 = 13;
const BPF_OBJ_GET_INFO_BY_FD: u32 = 15;
const BPF_LINK_CREATE: u32 = 28;

/// Map types (`enum bpf_map_type`).
pub const MAP_TYPE_HASH: u32 = 1;
pub const MAP_TYPE_XSKMAP: u32 = 17;
/// `map_flags`: the program may only read the map (user space still writes it).
pub const F_RDONLY_PROG: u32 = 1 << 7;
/// Update flags: create or replace.
pub const ANY: u64 = 0;
/// Program types (`enum bpf_prog_type`).
pub const PROG_TYPE_XDP: u32 = 6;
/// Attach types (`enum bpf_attach_type`).
pub const ATTACH_XDP: u32 = 37;

/// The attribute structs this module hands to the kernel; sealed so that only layouts
/// declared here reach `bpf(2)`.
trait Attr {}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}
impl Attr for MapCreateAttr {}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64, // also `next_key`
    flags: u64,
}
impl Attr for MapElemAttr {}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}
impl Attr for ProgLoadAttr {}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
}
impl Attr for TestRunAttr {}

#[repr(C)]
#[derive(Default)]
struct GetIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}
impl Attr for GetIdAttr {}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}
impl Attr for InfoAttr {}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}
impl Attr for LinkCreateAttr {}

/// The head of `struct bpf_prog_info`, up to and including `name`.
#[repr(C)]
#[derive(Default)]
struct ProgInfoRaw {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

/// bpf(`cmd`, `attr`): the non-negative result, or the error.
#[allow(private_bounds)]
fn sys_bpf<A: Attr>(cmd: u32, attr: &mut A) -> io::Result<i64> {
    // SAFETY: `attr` is one of the `#[repr(C)]` prefixes of `union bpf_attr` above, valid and
    // exclusively borrowed for the call, and its size is passed with it. Every pointer inside
    // was set by a function of this module to memory that outlives the call and is as long
    // as the field beside it (or the map's key/value size) says.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            (attr as *mut A).cast::<libc::c_void>(),
            std::mem::size_of::<A>() as libc::c_long,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fd_result(rc: i64) -> OwnedFd {
    // SAFETY: the bpf commands this is called for return a new file descriptor, now ours.
    unsafe { OwnedFd::from_raw_fd(rc as i32) }
}

fn object_name(name: &str) -> io::Result<[u8; 16]> {
    // The kernel takes at most 15 bytes of letters, digits, '_' and '.'.
    if name.len() > 15
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid BPF object name {name:?}"),
        ));
    }
    let mut out = [0u8; 16];
    out[..name.len()].copy_from_slice(name.as_bytes());
    Ok(out)
}

fn ptr(p: *const u8) -> u64 {
    p as usize as u64
}

/// Adds what a failing bpf(2) command was and, for EPERM, what it needs.
fn context(cmd: &str, e: io::Error, needs: &str) -> io::Error {
    let mut msg = format!("bpf({cmd}): {e}");
    if e.raw_os_error() == Some(libc::EPERM) {
        msg.push_str(&format!(" (needs {needs}"));
        let missing = missing_capabilities(needs);
        if !missing.is_empty() {
            msg.push_str(&format!("; this process lacks {}", missing.join(" and ")));
        }
        msg.push(')');
    }
    io::Error::new(e.kind(), msg)
}

/// Which of the capabilities named in `needs` ("CAP_BPF and CAP_NET_ADMIN") the process lacks
/// in its effective set. CAP_SYS_ADMIN stands in for both, as bpf(2) allows.
pub fn missing_capabilities(needs: &str) -> Vec<&'static str> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_BPF: u32 = 39;
    let Some(eff) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
    else {
        return Vec::new();
    };
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    if needs.contains("CAP_BPF") && !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if needs.contains("CAP_NET_ADMIN") && !has(CAP_NET_ADMIN) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    missing
}

// ---------------------------------------------------------------------------------------------
// Maps

/// A BPF map owned by this process, with the key and value sizes every access is checked
/// against (the kernel copies exactly that many bytes to and from the buffers given).
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

impl Map {
    /// BPF_MAP_CREATE. Needs CAP_BPF (and CAP_NET_ADMIN for an XSKMAP).
    pub fn create(
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
        name: &str,
    ) -> io::Result<Map> {
        let mut attr = MapCreateAttr {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_flags,
            map_name: object_name(name)?,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &mut attr)
            .map_err(|e| context("BPF_MAP_CREATE", e, "CAP_BPF and CAP_NET_ADMIN"))?;
        Ok(Map {
            fd: fd_result(fd),
            key_size: key_size as usize,
            value_size: value_size as usize,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    fn check(&self, what: &str, len: usize, want: usize) -> io::Result<()> {
        if len == want {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("map {what} of {len} bytes, the map's is {want}"),
            ))
        }
    }

    fn elem_attr(&self, key: &[u8]) -> MapElemAttr {
        MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: ptr(key.as_ptr()),
            ..Default::default()
        }
    }

    /// BPF_MAP_UPDATE_ELEM with `flags` ([`ANY`]: create or replace).
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
        self.check("key", key.len(), self.key_size)?;
        self.check("value", value.len(), self.value_size)?;
        let mut attr = MapElemAttr {
            value: ptr(value.as_ptr()),
            flags,
            ..self.elem_attr(key)
        };
        sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
            .map_err(|e| context("BPF_MAP_UPDATE_ELEM", e, "CAP_BPF"))?;
        Ok(())
    }

    /// BPF_MAP_DELETE_ELEM; `Ok(false)` when the key was not there.
    pub fn delete(&self, key: &[u8]) -> io::Result<bool> {
        self.check("key", key.len(), self.key_size)?;
        let mut attr = self.elem_attr(key);
        match sys_bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(context("BPF_MAP_DELETE_ELEM", e, "CAP_BPF")),
        }
    }

    /// BPF_MAP_LOOKUP_ELEM into `value`; `Ok(false)` when the key is not there.
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
        self.check("key", key.len(), self.key_size)?;
        self.check("value", value.len(), self.value_size)?;
        let mut attr = MapElemAttr {
            value: ptr(value.as_mut_ptr()),
            ..self.elem_attr(key)
        };
        match sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(context("BPF_MAP_LOOKUP_ELEM", e, "CAP_BPF")),
        }
    }

    /// Every key in the map (BPF_MAP_GET_NEXT_KEY from no key until ENOENT).
    pub fn keys(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut next = vec![0u8; self.key_size];
            let mut attr = MapElemAttr {
                map_fd: self.fd.as_raw_fd() as u32,
                // No key (null) asks for the first one.
                key: keys.last().map_or(0, |k| ptr(k.as_ptr())),
                value: ptr(next.as_mut_ptr()),
                ..Default::default()
            };
            match sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                Ok(_) => keys.push(next),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(keys),
                Err(e) => return Err(context("BPF_MAP_GET_NEXT_KEY", e, "CAP_BPF")),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Programs and links

/// BPF_PROG_LOAD. When the verifier refuses the program, loads it again with the verifier's
/// log on and puts the log (its first and last lines) in the error.
pub fn prog_load(
    prog_type: u32,
    insns: &[Insn],
    license: &CStr,
    name: &str,
) -> io::Result<OwnedFd> {
    let attempt = |log: Option<&mut [u8]>| {
        let (log_level, log_size, log_buf) = match log {
            Some(buf) => (1, buf.len() as u32, ptr(buf.as_mut_ptr())),
            None => (0, 0, 0),
        };
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: ptr(insns.as_ptr().cast()),
            license: ptr(license.as_ptr().cast()),
            log_level,
            log_size,
            log_buf,
            prog_name: object_name(name)?,
            ..Default::default()
        };
        sys_bpf(BPF_PROG_LOAD, &mut attr).map(fd_result)
    };
    let err = match attempt(None) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    if err.raw_os_error() == Some(libc::EPERM) {
        return Err(context("BPF_PROG_LOAD", err, "CAP_BPF and CAP_NET_ADMIN"));
    }
    let mut log = vec![0u8; 1 << 16];
    let again = attempt(Some(&mut log));
    let text =
        String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
    let err = match again {
        // Refused once and accepted with the log on: take it.
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    Err(io::Error::new(
        err.kind(),
        format!(
            "bpf(BPF_PROG_LOAD) of {name:?}: {err}; verifier log:\n{}",
            log_excerpt(&text)
        ),
    ))
}

/// The first 10 and the last 30 lines of a verifier log (the failing instruction is at the end).
fn log_excerpt(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    if lines.len() <= 40 {
        return lines.join("\n");
    }
    format!(
        "{}\n... ({} lines left out) ...\n{}",
        lines[..10].join("\n"),
        lines.len() - 40,
        lines[lines.len() - 30..].join("\n")
    )
}

/// BPF_PROG_TEST_RUN: runs the program once on `data` with context `ctx` (for XDP, a
/// `struct xdp_md` naming the receiving interface and queue, or none) and returns its return
/// value. The frame is copied; what the program writes to it is not returned.
pub fn prog_test_run(prog: BorrowedFd<'_>, data: &[u8], ctx: Option<&[u8]>) -> io::Result<u32> {
    let (ctx_in, ctx_size_in) = ctx.map_or((0, 0), |c| (ptr(c.as_ptr()), c.len() as u32));
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?,
        data_in: ptr(data.as_ptr()),
        repeat: 1,
        ctx_size_in,
        ctx_in,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_TEST_RUN, &mut attr)
        .map_err(|e| context("BPF_PROG_TEST_RUN", e, "CAP_BPF"))?;
    Ok(attr.retval)
}

/// BPF_LINK_CREATE for an XDP program on interface `ifindex` with XDP `flags` (the mode).
/// The program stays attached while the returned link is open.
pub fn xdp_link_create(prog: BorrowedFd<'_>, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: ATTACH_XDP,
        flags,
    };
    // Errors are left bare: the caller knows what they mean for the interface.
    sys_bpf(BPF_LINK_CREATE, &mut attr).map(fd_result)
}

/// BPF_PROG_GET_FD_BY_ID (needs CAP_SYS_ADMIN).
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetIdAttr {
        id,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)
        .map(fd_result)
        .map_err(|e| context("BPF_PROG_GET_FD_BY_ID", e, "CAP_SYS_ADMIN"))
}

/// What the kernel says about a loaded program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgInfo {
    pub id: u32,
    pub prog_type: u32,
    pub name: String,
}

/// BPF_OBJ_GET_INFO_BY_FD for a program.
pub fn prog_info(prog: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let mut info = ProgInfoRaw::default();
    let mut attr = InfoAttr {
        bpf_fd: prog.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfoRaw>() as u32,
        info: std::ptr::addr_of_mut!(info) as usize as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)
        .map_err(|e| context("BPF_OBJ_GET_INFO_BY_FD", e, "CAP_BPF"))?;
    let len = info.name.iter().position(|&b| b == 0).unwrap_or(16);
    Ok(ProgInfo {
        id: info.id,
        prog_type: info.prog_type,
        name: String::from_utf8_lossy(&info.name[..len]).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_encodes_instructions_like_the_kernel_headers() {
        // r0 = 2; exit  — the bytes clang emits for `return XDP_PASS;`.
        let i = mov_imm(R0, 2);
        assert_eq!((i.code, i.dst(), i.src(), i.off, i.imm), (0xb7, 0, 0, 0, 2));
        assert_eq!(exit().code, 0x95);
        // r2 = *(u32 *)(r1 + 4)
        let i = load(Size::W, R2, R1, 4);
        assert_eq!((i.code, i.dst(), i.src(), i.off), (0x61, 2, 1, 4));
        // *(u64 *)(r10 - 16) = r5
        let i = store(Size::DW, R10, -16, R5);
        assert_eq!((i.code, i.dst(), i.src(), i.off), (0x7b, 10, 5, -16));
        assert_eq!(call(51).code, 0x85);
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        if cfg!(target_endian = "little") {
            assert_eq!(load(Size::H, R5, R7, 12).regs, 0x75);
        }
    }

    #[test]
    fn xdp_assembler_resolves_forward_and_backward_jumps() {
        let mut a = Asm::new();
        let top = a.label();
        let end = a.label();
        a.bind(top);
        a.emit([mov_imm(R0, 0)]);
        a.jump(Cond::EqImm(R0, 1), end); // at 1, end at 3: off 1
        a.jump(Cond::Always, top); // at 2, top at 0: off -3
        a.bind(end);
        a.emit([exit()]);
        let p = a.finish().unwrap();
        assert_eq!(p[1].off, 1);
        assert_eq!(p[2].off, -3);
        let mut a = Asm::new();
        let nowhere = a.label();
        a.jump(Cond::Always, nowhere);
        assert!(a.finish().is_err());
    }

    #[test]
    fn xdp_object_names_are_checked() {
        assert!(object_name("tunneld_xdp").is_ok());
        assert!(object_name("sixteen_chars_xx").is_err());
        assert!(object_name("bad-name").is_err());
    }
}
