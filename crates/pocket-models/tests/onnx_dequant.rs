//! The `onnx-dequantize-int8` transform on small graphs built here, shaped like ONNX
//! Runtime's quantize_dynamic output; tract runs both sides to compare them.

mod common;

use common::message;
use common::onnx::*;
use pocket_models::Error;
use pocket_models::onnx_dequant::{Dequantized, dequantize_int8, dequantize_model};
use prost::Message as _;
use tract_onnx::pb::tensor_proto::DataType;
use tract_onnx::pb::{GraphProto, ModelProto, TensorProto};

/// Deterministic values in [-1, 1).
fn floats(len: usize, seed: u64) -> Vec<f32> {
    common::bytes(len, seed).iter().map(|&b| f32::from(b) / 128.0 - 1.0).collect()
}

/// int8 weights covering the whole range, -128 and 127 included.
fn weights(len: usize, seed: u64) -> Vec<i32> {
    let mut w: Vec<i32> = common::bytes(len, seed).iter().map(|&b| i32::from(b as i8)).collect();
    w[0] = -128;
    w[len - 1] = 127;
    w
}

fn graph(model: &ModelProto) -> &GraphProto {
    model.graph.as_ref().unwrap()
}

fn f32_values(t: &TensorProto) -> Vec<f32> {
    assert_eq!(t.data_type, DataType::Float as i32, "{}", t.name);
    t.raw_data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// x · w for x [m, k] and w [k, n], row-major, accumulated in f64.
fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] =
                (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(w[l * n + j])).sum::<f64>() as f32;
        }
    }
    y
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

#[test]
fn a_chain_becomes_one_f32_matmul_with_the_weight_dequantized() {
    let (m, k, n) = (3, 16, 8);
    let w = weights(k * n, 1);
    let (zero_point, scale) = (5, 0.0123_f32);
    let mut model = one_matmul(m as i64, k as i64, n as i64, &w, &[zero_point], &[scale]);
    let original = model.encode_to_vec();

    let done = dequantize_model(&mut model).unwrap();
    assert_eq!(
        done,
        Dequantized { matmuls: 1, weights: 1, removed_nodes: 4, removed_initializers: 3 },
        "DynamicQuantizeLinear, MatMulInteger, Cast and the scale Mul go; so do W's three tensors"
    );
    let g = graph(&model);
    assert_eq!(g.node.len(), 1);
    let matmul_node = &g.node[0];
    assert_eq!(
        (
            matmul_node.op_type.as_str(),
            matmul_node.name.as_str(),
            &matmul_node.input[..],
            &matmul_node.output[..]
        ),
        ("MatMul", "y", &["x".to_owned(), "W".to_owned()][..], &["y".to_owned()][..])
    );
    assert!(matmul_node.domain.is_empty() && matmul_node.attribute.is_empty());
    assert_eq!(g.initializer.len(), 1);
    let weight = &g.initializer[0];
    assert_eq!((weight.name.as_str(), &weight.dims[..]), ("W", &[k as i64, n as i64][..]));
    let expected: Vec<f32> = w.iter().map(|&q| (q - zero_point) as f32 * scale).collect();
    assert_eq!(f32_values(weight), expected, "(W - zero_point) * scale, exactly");
    // The value_info of the removed int32 → float cast goes with it; inputs, outputs and
    // the opset stay.
    assert!(g.value_info.is_empty());
    assert_eq!((g.input.len(), g.output.len()), (1, 1));
    assert_eq!(model.opset_import[0].version, 18);

    // Numerically: the f32 graph is x · W_f32; the int8 graph is that up to the activation
    // quantization it no longer does.
    let rewritten = model.encode_to_vec();
    let x = floats(m * k, 2);
    let exact = matmul(&x, &expected, m, k, n);
    let f32_out = run(&rewritten, &x, m, k);
    let int8_out = run(&original, &x, m, k);
    assert!(max_diff(&f32_out, &exact) < 1e-5, "{f32_out:?} vs {exact:?}");
    // Each of the k products is off by at most half a step of x's scale (2/255) times |w|.
    let bound = k as f32 * (1.0 / 255.0) * 128.0 * scale * 1.1;
    let diff = max_diff(&int8_out, &exact);
    assert!(diff < bound, "int8 graph differs by {diff}, more than {bound}");
}

#[test]
fn per_column_uint8_weights_and_a_swapped_mul_are_handled() {
    let (m, k, n) = (2, 8, 4);
    let w: Vec<i32> = common::bytes(k * n, 3).iter().map(|&b| i32::from(b)).collect();
    let zero_points = [0, 128, 255, 17];
    let scales = [0.5_f32, 0.01, 0.002, 1.5];
    let mut model = one_matmul(m as i64, k as i64, n as i64, &w, &zero_points, &scales);
    let g = model.graph.as_mut().unwrap();
    for t in &mut g.initializer {
        if t.name != "W_scale" {
            t.data_type = DataType::Uint8 as i32;
        }
        if t.name == "W_zero_point" {
            // int8/uint8 may also be stored in int32_data.
            t.int32_data = zero_points.to_vec();
            t.raw_data.clear();
        }
        if t.name == "W_scale" {
            // And floats in raw_data.
            t.raw_data = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            t.float_data.clear();
        }
    }
    let last = g.node.last_mut().unwrap();
    last.input.swap(0, 1);
    let original = model.encode_to_vec();

    let done = dequantize_model(&mut model).unwrap();
    assert_eq!(done.matmuls, 1);
    let weight = &graph(&model).initializer[0];
    let expected: Vec<f32> =
        w.iter().enumerate().map(|(i, &q)| (q - zero_points[i % n]) as f32 * scales[i % n]).collect();
    assert_eq!(f32_values(weight), expected);

    let x = floats(m * k, 4);
    let exact = matmul(&x, &expected, m, k, n);
    assert!(max_diff(&run(&model.encode_to_vec(), &x, m, k), &exact) < 1e-4);
    let int8_diff = max_diff(&run(&original, &x, m, k), &exact);
    assert!(int8_diff < k as f32 * (1.0 / 255.0) * 255.0 * 1.5, "int8 graph differs by {int8_diff}");
}

#[test]
fn shared_quantization_and_shared_weights_are_rewritten_once_and_others_kept() {
    // Like q, k and v of an attention layer: one DynamicQuantizeLinear feeds three chains;
    // two of them (tied weights) share a quantized weight. A MatMulInteger whose weight is
    // a graph input is no such chain and stays, and with it the DynamicQuantizeLinear.
    let (k, n) = (4, 2);
    let w = weights(k * n, 5);
    let mut nodes = vec![quantize_x()];
    nodes.extend(chain("q", "Wq"));
    nodes.extend(chain("k", "Wk"));
    nodes.extend(chain("v", "Wk"));
    nodes.push(node("MatMulInteger", "dynamic", &["x_quantized", "b", "x_zero_point"], &["d"]));
    let mut initializer = Vec::new();
    for name in ["Wq", "Wk"] {
        initializer.push(int8(&format!("{name}_quantized"), &[k as i64, n as i64], &w, true));
        initializer.push(int8(&format!("{name}_zero_point"), &[], &[0], true));
        initializer.push(float(&format!("{name}_scale"), &[], &[0.1]));
    }
    // Already unused before the rewrite: not this transform's business, left alone.
    initializer.push(float("unused", &[1], &[1.0]));
    let outputs = ["q", "k", "v", "d"].map(|o| value(o, &[1, n as i64]));
    let mut model = model(GraphProto {
        node: nodes,
        initializer,
        input: vec![value("x", &[1, k as i64]), value("b", &[k as i64, n as i64])],
        output: outputs.to_vec(),
        ..GraphProto::default()
    });

    let done = dequantize_model(&mut model).unwrap();
    assert_eq!(done, Dequantized { matmuls: 3, weights: 2, removed_nodes: 9, removed_initializers: 6 });
    let g = graph(&model);
    let nodes: Vec<String> = g.node.iter().map(|n| format!("{} {}", n.op_type, n.input.join(","))).collect();
    assert_eq!(
        nodes,
        [
            "DynamicQuantizeLinear x",
            "MatMul x,Wq",
            "MatMul x,Wk",
            "MatMul x,Wk",
            "MatMulInteger x_quantized,b,x_zero_point"
        ]
    );
    let names: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["unused", "Wq", "Wk"]);
}

#[test]
fn new_names_do_not_collide() {
    // "W" is taken (a graph output here), so the f32 weight gets another name.
    let mut model = one_matmul(1, 2, 2, &[1, 2, 3, 4], &[0], &[1.0]);
    let g = model.graph.as_mut().unwrap();
    g.node.push(node("Identity", "copy", &["y"], &["W"]));
    g.output.push(value("W", &[1, 2]));
    dequantize_model(&mut model).unwrap();
    let g = graph(&model);
    assert_eq!(g.initializer.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["W_1"]);
    assert_eq!(g.node[0].input, ["x", "W_1"]);
}

#[test]
fn the_bytes_round_trip_is_deterministic() {
    let bytes = one_matmul(2, 8, 4, &weights(32, 6), &[3], &[0.25]).encode_to_vec();
    let once = dequantize_int8(bytes.clone()).unwrap();
    assert_eq!(once, dequantize_int8(bytes.clone()).unwrap());
    let mut model = ModelProto::decode(bytes.as_slice()).unwrap();
    dequantize_model(&mut model).unwrap();
    assert_eq!(once, model.encode_to_vec());
}

/// The error's message, which must be an [`Error::InvalidOnnx`].
fn invalid(result: pocket_models::Result<impl std::fmt::Debug>) -> String {
    let err = result.unwrap_err();
    assert!(matches!(err, Error::InvalidOnnx { .. }), "{err:?}");
    message(&err)
}

#[test]
fn what_is_not_a_quantized_onnx_graph_is_a_clear_error() {
    let msg = invalid(dequantize_int8(b"\xff\xffnot protobuf at all".to_vec()));
    assert!(msg.contains("not an ONNX model") && msg.contains("protobuf"), "{msg}");

    let msg = invalid(dequantize_int8(ModelProto::default().encode_to_vec()));
    assert!(msg.contains("no graph"), "{msg}");

    // An f32 graph (already rewritten, say): nothing to do is an error, not a silent copy.
    let rewritten =
        dequantize_int8(one_matmul(1, 2, 2, &[1, 2, 3, 4], &[0], &[1.0]).encode_to_vec()).unwrap();
    let msg = invalid(dequantize_int8(rewritten));
    assert!(msg.contains("no DynamicQuantizeLinear → MatMulInteger → Cast → Mul chain"), "{msg}");
}

#[test]
fn broken_tensors_in_a_chain_are_errors_naming_node_and_tensor() {
    let base = || one_matmul(1, 2, 2, &[1, 2, 3, 4], &[0], &[1.0]);
    let edit = |name: &'static str, f: fn(&mut TensorProto)| {
        let mut model = base();
        let g = model.graph.as_mut().unwrap();
        f(g.initializer.iter_mut().find(|t| t.name == name).unwrap());
        model
    };
    let cases: Vec<(ModelProto, &str)> = vec![
        (edit("W_quantized", |t| t.raw_data.truncate(3)), "holds 3 bytes for 4 elements"),
        (edit("W_quantized", |t| t.dims = vec![4]), "only non-empty 2-D weights"),
        (edit("W_quantized", |t| t.data_type = DataType::Int16 as i32), "int16, not int8 or uint8"),
        (edit("W_zero_point", |t| t.dims = vec![3]), "scalar, [1] or [N]"),
        (edit("W_zero_point", |t| t.data_type = DataType::Uint8 as i32), "the same"),
        (edit("W_scale", |t| t.float_data.clear()), "holds 0 values for 1 elements"),
        (edit("W_scale", |t| t.data_type = DataType::Double as i32), "double, not float"),
        (edit("W_quantized", |t| t.data_location = Some(1)), "external data"),
    ];
    for (mut model, needle) in cases {
        let msg = invalid(dequantize_model(&mut model));
        assert!(msg.contains(needle), "{needle:?} not in: {msg}");
        assert!(msg.contains("MatMulInteger \"y_quant\""), "does not name the node: {msg}");
    }
}
