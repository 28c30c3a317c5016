//! Helpers shared by the integration tests: fake wheels, fake models, a tiny HTTP server.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// Deterministic pseudo-random bytes (incompressible enough to exercise deflate).
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Writes a wheel (a zip) at `dir/file_name` holding `members`.
pub fn wheel(dir: &Path, file_name: &str, members: &[(&str, &[u8])]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(file_name);
    let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    for (name, data) in members {
        zip.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(data).unwrap();
    }
    let dist = file_name.split('-').take(2).collect::<Vec<_>>().join("-");
    zip.start_file(format!("{dist}.dist-info/METADATA"), zip::write::SimpleFileOptions::default()).unwrap();
    zip.write_all(b"Metadata-Version: 2.1\n").unwrap();
    zip.finish().unwrap();
    path
}

/// A fake model split over `n` wheels of package `fake-model-partN==1.0.0`, member
/// `fake_model_partN/data/partN.bin`. Returns the whole model's bytes and the `parts` TOML.
pub fn split_model(wheel_dir: &Path, len: usize, n: usize) -> (Vec<u8>, String) {
    let data = bytes(len, 7);
    let chunk = len.div_ceil(n);
    let mut parts = String::from("[");
    for (i, piece) in data.chunks(chunk).enumerate() {
        let k = i + 1;
        let member = format!("fake_model_part{k}/data/part{k}.bin");
        wheel(wheel_dir, &format!("fake_model_part{k}-1.0.0-py3-none-any.whl"), &[(&member, piece)]);
        parts +=
            &format!("{{ package = \"fake-model-part{k}\", version = \"1.0.0\", path = \"{member}\" }}, ");
    }
    parts += "]";
    (data, parts)
}

/// A one-file manifest with the given sources (TOML `[[files.sources]]` tables).
pub fn manifest_toml(name: &str, file: &str, sha256: &str, size: usize, sources: &str) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"test model\"\nformat = \"gguf\"\n\n\
         [[files]]\nname = \"{file}\"\nsha256 = \"{sha256}\"\nsize = {size}\n{sources}"
    )
}

pub fn pip_source(parts: &str) -> String {
    format!("\n[[files.sources]]\nkind = \"pip\"\nparts = {parts}\n")
}

/// Entries of `dir`, sorted, as file names.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Serves `routes` (path → body) over HTTP/1.1 on 127.0.0.1 until the test ends; other
/// paths get 404. Returns the base URL.
pub fn serve(routes: HashMap<String, Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
            }
            let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let (status, body) = match routes.get(&path) {
                Some(body) => ("200 OK", body.clone()),
                None => ("404 Not Found", b"not found".to_vec()),
            };
            let head =
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    base
}

/// The error's whole message with its causes, as the CLI prints it.
pub fn message(err: &pocket_models::Error) -> String {
    let mut out = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        out += &format!(": {cause}");
        source = cause.source();
    }
    out
}

/// Builders of small ONNX graphs shaped like ONNX Runtime's `quantize_dynamic` output.
pub mod onnx {
    use tract_onnx::pb::tensor_proto::DataType;
    use tract_onnx::pb::tensor_shape_proto::{Dimension, dimension};
    use tract_onnx::pb::{
        AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
        TypeProto, ValueInfoProto, attribute_proto, type_proto,
    };

    /// A float tensor value of shape `dims`.
    pub fn value(name: &str, dims: &[i64]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| Dimension { value: Some(dimension::Value::DimValue(d)), ..Dimension::default() })
            .collect();
        let tensor =
            type_proto::Tensor { elem_type: DataType::Float as i32, shape: Some(TensorShapeProto { dim }) };
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(tensor)),
                ..TypeProto::default()
            }),
            ..ValueInfoProto::default()
        }
    }

    pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: name.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..NodeProto::default()
        }
    }

    pub fn cast_to_float(name: &str, input: &str, output: &str) -> NodeProto {
        let mut cast = node("Cast", name, &[input], &[output]);
        cast.attribute.push(AttributeProto {
            name: "to".into(),
            r#type: attribute_proto::AttributeType::Int as i32,
            i: DataType::Float as i64,
            ..AttributeProto::default()
        });
        cast
    }

    /// An int8 (or, `signed = false`, uint8) tensor with its data in `raw_data`.
    pub fn int8(name: &str, dims: &[i64], values: &[i32], signed: bool) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: if signed { DataType::Int8 } else { DataType::Uint8 } as i32,
            raw_data: values.iter().map(|&v| v as u8).collect(),
            ..TensorProto::default()
        }
    }

    /// A float tensor with its data in `float_data` (as quantize_dynamic writes scales).
    pub fn float(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: DataType::Float as i32,
            float_data: values.to_vec(),
            ..TensorProto::default()
        }
    }

    /// The nodes of one quantized chain computing `out = x · W` from the shared
    /// DynamicQuantizeLinear of `x` (outputs `x_quantized`, `x_scale`, `x_zero_point`), as
    /// quantize_dynamic names them; `w` names the weight's initializers (`{w}_quantized`,
    /// `{w}_zero_point`, `{w}_scale`).
    pub fn chain(out: &str, w: &str) -> Vec<NodeProto> {
        vec![
            node(
                "MatMulInteger",
                &format!("{out}_quant"),
                &["x_quantized", &format!("{w}_quantized"), "x_zero_point", &format!("{w}_zero_point")],
                &[&format!("{out}_int32")],
            ),
            cast_to_float(&format!("{out}_cast"), &format!("{out}_int32"), &format!("{out}_cast_output")),
            node(
                "Mul",
                &format!("{out}_scales_mul"),
                &["x_scale", &format!("{w}_scale")],
                &[&format!("{out}_scales")],
            ),
            node(
                "Mul",
                &format!("{out}_output_scale_mul"),
                &[&format!("{out}_cast_output"), &format!("{out}_scales")],
                &[out],
            ),
        ]
    }

    /// The DynamicQuantizeLinear of input `x`.
    pub fn quantize_x() -> NodeProto {
        node("DynamicQuantizeLinear", "x_QuantizeLinear", &["x"], &["x_quantized", "x_scale", "x_zero_point"])
    }

    /// A model around `graph`, opset 18 like the real ones.
    pub fn model(graph: GraphProto) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 18 }],
            producer_name: "pocket-models tests".into(),
            graph: Some(graph),
            ..ModelProto::default()
        }
    }

    /// `y = x · W` for x [m, k] through one quantized chain; W is int8 [k, n] with the
    /// given zero point and scale (one value: per tensor; n values: per column).
    pub fn one_matmul(m: i64, k: i64, n: i64, w: &[i32], zero_point: &[i32], scale: &[f32]) -> ModelProto {
        let per = |len: usize| if len == 1 { vec![] } else { vec![n] };
        let mut nodes = vec![quantize_x()];
        nodes.extend(chain("y", "W"));
        model(GraphProto {
            name: "one_matmul".into(),
            node: nodes,
            initializer: vec![
                int8("W_quantized", &[k, n], w, true),
                int8("W_zero_point", &per(zero_point.len()), zero_point, true),
                float("W_scale", &per(scale.len()), scale),
            ],
            input: vec![value("x", &[m, k])],
            output: vec![value("y", &[m, n])],
            value_info: vec![value("y_cast_output", &[m, n])],
            ..GraphProto::default()
        })
    }

    /// Runs `model` in tract on one f32 input [m, k]; returns the first output, flattened.
    pub fn run(model: &[u8], x: &[f32], m: usize, k: usize) -> Vec<f32> {
        use tract_onnx::prelude::*;
        let plan = tract_onnx::onnx()
            .model_for_read(&mut &model[..])
            .unwrap()
            .into_optimized()
            .unwrap()
            .into_runnable()
            .unwrap();
        let input = tract_ndarray::Array2::from_shape_vec((m, k), x.to_vec()).unwrap().into_tensor();
        let out = plan.run(tvec!(input.into())).unwrap();
        out[0].to_plain_array_view::<f32>().unwrap().iter().copied().collect()
    }
}
