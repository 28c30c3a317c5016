//! The `onnx-dequantize-int8` transform: int8 dynamic-quantized matmuls back to f32.
//!
//! ONNX Runtime's dynamic quantization (`quantize_dynamic`) turns each `MatMul(x, W)` with a
//! constant `W` into a chain that quantizes `x` at run time and multiplies integers:
//!
//! ```text
//! x ─ DynamicQuantizeLinear ─┬ x_q ───── MatMulInteger(x_q, W_q, x_zp, W_zp) ─ Cast(float) ─┐
//!                            ├ x_zp ─────────────┘                                           Mul ─ y
//!                            └ x_scale ─ Mul(x_scale, W_scale) ──────────────────────────────┘
//! ```
//!
//! That makes a model a quarter of the size to download, but slow or wrong where we run it:
//! tract runs these chains far slower than f32 `MatMul`s (a flan-t5-small decoder step:
//! ≈1.5 s instead of ≈35 ms on a CPU without VNNI, about 40×, per shared/MODELS.md; still
//! ≈78 ms instead of ≈11 ms on an AVX-VNNI EPYC), and ONNX Runtime gives wrong output for
//! such graphs on CPUs without VNNI. So `pocket pull` rewrites each chain, once, at fetch
//! time, into
//!
//! ```text
//! x ─ MatMul(x, W_f32) ─ y        W_f32 = (W_q − W_zp) × W_scale
//! ```
//!
//! (the weights dequantized as ONNX `DequantizeLinear` defines it, per tensor or per
//! column), and removes the nodes and initializers nothing reads any more. The activations
//! are no longer quantized either, so the result is closer to the original f32 model than
//! the int8 graph was, not further. Weights take 4 bytes instead of 1 on disk and in
//! memory (flan-t5-small's two graphs: 94 MB → 276 MB): the price of running fast.
//!
//! The rewrite is deterministic (same input bytes, same output bytes: graph order is kept,
//! new names are derived from old ones, and prost encodes fields in a fixed order), so a
//! manifest can pin the sha256 of the result.

use std::collections::{HashMap, HashSet};

use prost::Message as _;
use tract_onnx::pb::tensor_proto::{DataLocation, DataType};
use tract_onnx::pb::{GraphProto, ModelProto, NodeProto, TensorProto};

use crate::{Error, Result};

/// What [`dequantize_model`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dequantized {
    /// Chains rewritten into one f32 `MatMul` each.
    pub matmuls: usize,
    /// f32 weights added (fewer than `matmuls` where chains share a quantized weight).
    pub weights: usize,
    /// Nodes removed because nothing reads them any more: the chains'
    /// `DynamicQuantizeLinear`, `MatMulInteger`, `Cast` and scale `Mul` nodes.
    pub removed_nodes: usize,
    /// Initializers removed because nothing reads them any more: the int8 weights, their
    /// zero points and scales.
    pub removed_initializers: usize,
}

/// Decodes an ONNX model, rewrites its int8 matmul chains with [`dequantize_model`], and
/// encodes it again. Takes the input by value: it is freed once decoded, which lowers the
/// peak memory of a pull by the size of the file.
pub fn dequantize_int8(onnx: Vec<u8>) -> Result<Vec<u8>> {
    let mut model = ModelProto::decode(onnx.as_slice()).map_err(|source| Error::InvalidOnnx {
        reason: "it is not an ONNX model (its protobuf does not decode)".into(),
        source: Some(source),
    })?;
    drop(onnx);
    let done = dequantize_model(&mut model)?;
    tracing::debug!(
        "onnx-dequantize-int8: {} matmuls rewritten, {} f32 weights added, {} nodes and {} initializers removed",
        done.matmuls,
        done.weights,
        done.removed_nodes,
        done.removed_initializers
    );
    Ok(model.encode_to_vec())
}

/// Rewrites every `DynamicQuantizeLinear → MatMulInteger → Cast(float) → Mul` chain whose
/// weight, weight zero point and weight scale are initializers into one f32
/// `MatMul(x, W_f32)`, and removes what becomes unused. `MatMulInteger` nodes that are not
/// part of such a chain are left as they are (they still compute the right thing).
///
/// Errors: a model without a graph or without any such chain (this is not the graph the
/// transform is for), and a chain whose tensors break the ONNX spec (a weight that is not
/// int8/uint8 or not 2-D, data that does not match the shape, a zero point or scale that is
/// neither per tensor nor per column, external data).
pub fn dequantize_model(model: &mut ModelProto) -> Result<Dequantized> {
    let graph = model.graph.as_mut().ok_or_else(|| invalid("it has no graph".into()))?;
    let before = Liveness::of(graph);
    let mut done = Dequantized::default();
    let mut replacements = Vec::new();
    let mut weights = Vec::new();
    {
        let index = Index::new(graph);
        let mut names = index.names();
        // (weight, zero point, scale) → the f32 weight made from them, for shared weights.
        let mut made: HashMap<(&str, &str, &str), String> = HashMap::new();
        for i in 0..graph.node.len() {
            let Some(chain) = index.chain(i) else { continue };
            let zero_point = chain.zero_point.map_or("", |t| t.name.as_str());
            let key = (chain.weight.name.as_str(), zero_point, chain.scale.name.as_str());
            let weight = match made.get(&key) {
                Some(name) => name.clone(),
                None => {
                    let base = chain.weight.name.strip_suffix("_quantized").unwrap_or(&chain.weight.name);
                    let name = fresh_name(base, &mut names);
                    weights.push(dequantize(&chain, name.clone())?);
                    made.insert(key, name.clone());
                    name
                }
            };
            let name = chain.matmul.name.strip_suffix("_quant").unwrap_or(&chain.matmul.name);
            replacements.push((
                i,
                NodeProto {
                    name: name.to_owned(),
                    op_type: "MatMul".into(),
                    input: vec![chain.x.to_owned(), weight],
                    output: vec![chain.output.to_owned()],
                    ..NodeProto::default()
                },
            ));
        }
    }
    if replacements.is_empty() {
        return Err(invalid(
            "it has no DynamicQuantizeLinear → MatMulInteger → Cast → Mul chain with a constant \
             int8 or uint8 weight; onnx-dequantize-int8 is for graphs quantized by ONNX Runtime's \
             quantize_dynamic"
                .into(),
        ));
    }
    done.matmuls = replacements.len();
    done.weights = weights.len();
    // In place of each chain's last Mul: it comes after x is computed, so the node order
    // stays topological.
    for (i, node) in replacements {
        graph.node[i] = node;
    }
    graph.initializer.extend(weights);
    let after = Liveness::of(graph);
    (done.removed_nodes, done.removed_initializers) = sweep(graph, &before, &after);
    Ok(done)
}

/// One chain found by [`Index::chain`], borrowed from the graph.
struct Chain<'g> {
    /// The f32 input that `DynamicQuantizeLinear` quantizes.
    x: &'g str,
    matmul: &'g NodeProto,
    weight: &'g TensorProto,
    /// `None` when `MatMulInteger` has no `b_zero_point` (it is then 0).
    zero_point: Option<&'g TensorProto>,
    /// The weight's scale, multiplied by x's scale in the scale `Mul`.
    scale: &'g TensorProto,
    /// The last `Mul`'s output: what the chain computes.
    output: &'g str,
}

/// Lookups over a graph: who produces each value, and the initializers by name.
struct Index<'g> {
    graph: &'g GraphProto,
    producer: HashMap<&'g str, &'g NodeProto>,
    initializer: HashMap<&'g str, &'g TensorProto>,
}

impl<'g> Index<'g> {
    fn new(graph: &'g GraphProto) -> Index<'g> {
        let producer =
            graph.node.iter().flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n))).collect();
        let initializer = graph.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
        Index { graph, producer, initializer }
    }

    /// Every name the graph uses, so that new names collide with none.
    fn names(&self) -> HashSet<String> {
        let g = self.graph;
        let values = g.input.iter().chain(&g.output).chain(&g.value_info).map(|v| v.name.clone());
        let tensors = g.initializer.iter().map(|t| t.name.clone());
        let edges = g.node.iter().flat_map(|n| n.input.iter().chain(&n.output).cloned());
        values.chain(tensors).chain(edges).collect()
    }

    /// The node producing `name` if it is a standard-domain `op` with one output.
    fn produced_by(&self, name: &str, op: &str) -> Option<&'g NodeProto> {
        let node = *self.producer.get(name)?;
        let standard = node.domain.is_empty() || node.domain == "ai.onnx";
        (standard && node.op_type == op && node.output.len() == 1).then_some(node)
    }

    /// The chain ending in node `i`, if node `i` is the last `Mul` of one. Only the wiring is
    /// checked here; [`dequantize`] checks the tensors.
    fn chain(&self, i: usize) -> Option<Chain<'g>> {
        let mul = &self.graph.node[i];
        let standard = mul.domain.is_empty() || mul.domain == "ai.onnx";
        if !standard || mul.op_type != "Mul" || mul.input.len() != 2 || mul.output.len() != 1 {
            return None;
        }
        // Mul commutes: the product may come first or second.
        self.chain_from(mul, &mul.input[0], &mul.input[1])
            .or_else(|| self.chain_from(mul, &mul.input[1], &mul.input[0]))
    }

    fn chain_from(&self, mul: &'g NodeProto, product: &str, scales: &str) -> Option<Chain<'g>> {
        let cast = self.produced_by(product, "Cast")?;
        let to_float = cast.attribute.iter().any(|a| a.name == "to" && a.i == DataType::Float as i64);
        if !to_float || cast.input.len() != 1 {
            return None;
        }
        let matmul = self.produced_by(&cast.input[0], "MatMulInteger")?;
        let [a, b, a_zero_point, rest @ ..] = matmul.input.as_slice() else { return None };
        let quantize = *self.producer.get(a.as_str())?;
        if quantize.op_type != "DynamicQuantizeLinear" || quantize.input.len() != 1 {
            return None;
        }
        // x_q must be paired with its own zero point, and rescaled by its own scale.
        let [x_q, x_scale, x_zero_point] = quantize.output.as_slice() else { return None };
        if a != x_q || a_zero_point != x_zero_point {
            return None;
        }
        let scale_mul = self.produced_by(scales, "Mul")?;
        let w_scale = match scale_mul.input.as_slice() {
            [s, w] | [w, s] if s == x_scale => w,
            _ => return None,
        };
        // A weight computed at run time cannot be dequantized ahead of time: leave it.
        let weight = self.initializer.get(b.as_str())?;
        let scale = self.initializer.get(w_scale.as_str())?;
        let zero_point = match rest.first().filter(|name| !name.is_empty()) {
            Some(name) => Some(*self.initializer.get(name.as_str())?),
            None => None,
        };
        Some(Chain { x: &quantize.input[0], matmul, weight, zero_point, scale, output: &mul.output[0] })
    }
}

/// The f32 weight `(W − zero_point) × scale` of `chain`, named `name`.
fn dequantize(chain: &Chain<'_>, name: String) -> Result<TensorProto> {
    let node = &chain.matmul.name;
    let weight = chain.weight;
    let bad = |what: String| invalid(format!("MatMulInteger {node:?}: {what}"));
    let signed = match DataType::try_from(weight.data_type) {
        Ok(DataType::Int8) => true,
        Ok(DataType::Uint8) => false,
        _ => {
            return Err(bad(format!(
                "weight {:?} has element type {}, not int8 or uint8",
                weight.name,
                type_name(weight.data_type)
            )));
        }
    };
    let (k, n) = match weight.dims.as_slice() {
        [k, n] if *k > 0 && *n > 0 => (to_usize(*k), to_usize(*n)),
        dims => {
            return Err(bad(format!(
                "weight {:?} has shape {dims:?}; only non-empty 2-D weights [K, N] are supported",
                weight.name
            )));
        }
    };
    let count = k.checked_mul(n).ok_or_else(|| bad(format!("weight {:?} is too large", weight.name)))?;
    let w = integers(weight, signed, count).map_err(&bad)?;
    let zero_point = match chain.zero_point {
        None => vec![0],
        Some(t) if t.data_type != weight.data_type => {
            return Err(bad(format!(
                "zero point {:?} has element type {}, but the weight is {}; ONNX wants the same",
                t.name,
                type_name(t.data_type),
                type_name(weight.data_type)
            )));
        }
        Some(t) => integers(t, signed, per_column(t, n).map_err(&bad)?).map_err(&bad)?,
    };
    let scale = chain.scale;
    if scale.data_type != DataType::Float as i32 {
        return Err(bad(format!(
            "scale {:?} has element type {}, not float",
            scale.name,
            type_name(scale.data_type)
        )));
    }
    let scale = floats(scale, per_column(scale, n).map_err(&bad)?).map_err(&bad)?;
    let mut raw = Vec::with_capacity(count * 4);
    for (i, q) in w.iter().enumerate() {
        let column = i % n;
        let z = zero_point[if zero_point.len() == 1 { 0 } else { column }];
        let s = scale[if scale.len() == 1 { 0 } else { column }];
        // q − z fits in i32 and is exact in f32 (|q − z| ≤ 255); one rounding, in the
        // multiply, as DequantizeLinear does it.
        raw.extend_from_slice(&(((q - z) as f32) * s).to_le_bytes());
    }
    Ok(TensorProto {
        name,
        dims: vec![to_i64(k), to_i64(n)],
        data_type: DataType::Float as i32,
        raw_data: raw,
        ..TensorProto::default()
    })
}

/// How many elements a zero point or scale has, if it is per tensor (1) or per column (`n`).
fn per_column(t: &TensorProto, n: usize) -> std::result::Result<usize, String> {
    match t.dims.as_slice() {
        [] | [1] => Ok(1),
        [d] if usize::try_from(*d).is_ok_and(|d| d == n) => Ok(n),
        dims => Err(format!(
            "{:?} has shape {dims:?}; a weight's zero point and scale must be a scalar, [1] or [N] \
             (per column, N = {n})",
            t.name
        )),
    }
}

/// The `count` elements of an int8/uint8 tensor, from `raw_data` or `int32_data`.
fn integers(t: &TensorProto, signed: bool, count: usize) -> std::result::Result<Vec<i32>, String> {
    check_inline(t)?;
    if !t.raw_data.is_empty() {
        if t.raw_data.len() != count {
            return Err(format!("{:?} holds {} bytes for {count} elements", t.name, t.raw_data.len()));
        }
        return Ok(t
            .raw_data
            .iter()
            .map(|&b| if signed { i32::from(b as i8) } else { i32::from(b) })
            .collect());
    }
    if t.int32_data.len() != count {
        return Err(format!("{:?} holds {} values for {count} elements", t.name, t.int32_data.len()));
    }
    let range = if signed { -128..=127 } else { 0..=255 };
    match t.int32_data.iter().find(|v| !range.contains(*v)) {
        Some(v) => Err(format!("{:?} holds {v}, outside the range of its element type", t.name)),
        None => Ok(t.int32_data.clone()),
    }
}

/// The `count` elements of a float tensor, from `raw_data` (little-endian) or `float_data`.
fn floats(t: &TensorProto, count: usize) -> std::result::Result<Vec<f32>, String> {
    check_inline(t)?;
    if !t.raw_data.is_empty() {
        if t.raw_data.len() != count * 4 {
            return Err(format!("{:?} holds {} bytes for {count} floats", t.name, t.raw_data.len()));
        }
        let floats = t.raw_data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        return Ok(floats.collect());
    }
    if t.float_data.len() != count {
        return Err(format!("{:?} holds {} values for {count} elements", t.name, t.float_data.len()));
    }
    Ok(t.float_data.clone())
}

fn check_inline(t: &TensorProto) -> std::result::Result<(), String> {
    if t.data_location == Some(DataLocation::External as i32) || !t.external_data.is_empty() {
        return Err(format!(
            "{:?} is stored in an external data file; only self-contained .onnx files are supported",
            t.name
        ));
    }
    Ok(())
}

/// What a graph reads: the nodes needed to compute its outputs, and every value name those
/// nodes (and the outputs) read.
struct Liveness {
    nodes: Vec<bool>,
    reads: HashSet<String>,
}

impl Liveness {
    fn of(graph: &GraphProto) -> Liveness {
        let mut reads: HashSet<String> = graph.output.iter().map(|o| o.name.clone()).collect();
        let mut nodes = vec![false; graph.node.len()];
        // Nodes are in topological order, so one backward pass finds them all; the loop only
        // guards against a graph that is not sorted.
        let mut changed = true;
        while changed {
            changed = false;
            for (i, node) in graph.node.iter().enumerate().rev() {
                if nodes[i] || !(node.output.is_empty() || node.output.iter().any(|o| reads.contains(o))) {
                    continue;
                }
                nodes[i] = true;
                changed = true;
                let mut inputs = Vec::new();
                node_reads(node, &mut inputs);
                reads.extend(inputs.into_iter().map(str::to_owned));
            }
        }
        Liveness { nodes, reads }
    }
}

/// The names `node` reads, including those its subgraphs (If, Loop, Scan bodies) read from
/// the enclosing graph.
fn node_reads<'a>(node: &'a NodeProto, out: &mut Vec<&'a str>) {
    out.extend(node.input.iter().map(String::as_str));
    for attribute in &node.attribute {
        for graph in attribute.g.iter().chain(&attribute.graphs) {
            for inner in &graph.node {
                node_reads(inner, out);
            }
        }
    }
}

/// Removes the nodes and initializers that were needed `before` the rewrite and are not
/// `after` it, and the value_info of the values those nodes produced. Whatever was already
/// unused stays: this transform only cleans up after itself. Returns how many nodes and
/// initializers went.
fn sweep(graph: &mut GraphProto, before: &Liveness, after: &Liveness) -> (usize, usize) {
    let mut removed_values = HashSet::new();
    let mut i = 0;
    let nodes = graph.node.len();
    graph.node.retain(|node| {
        // The rewrite replaced nodes in place and added none, so indices still match.
        let was_needed = before.nodes.get(i).copied().unwrap_or(false);
        let is_needed = after.nodes.get(i).copied().unwrap_or(true);
        let keep = is_needed || !was_needed;
        i += 1;
        if !keep {
            removed_values.extend(node.output.iter().cloned());
        }
        keep
    });
    let inputs: HashSet<&str> = graph.input.iter().map(|v| v.name.as_str()).collect();
    let initializers = graph.initializer.len();
    graph.initializer.retain(|t| {
        let dropped = before.reads.contains(&t.name) && !after.reads.contains(&t.name);
        // An initializer that is also a graph input is that input's default: keep it.
        !dropped || inputs.contains(t.name.as_str())
    });
    graph.value_info.retain(|v| !removed_values.contains(&v.name));
    (nodes - graph.node.len(), initializers - graph.initializer.len())
}

/// `base`, or `base_1`, `base_2`, … : the first that no value in the graph has yet.
fn fresh_name(base: &str, names: &mut HashSet<String>) -> String {
    let mut name = base.to_owned();
    let mut n = 0;
    while names.contains(&name) {
        n += 1;
        name = format!("{base}_{n}");
    }
    names.insert(name.clone());
    name
}

fn type_name(data_type: i32) -> String {
    match DataType::try_from(data_type) {
        Ok(t) => t.as_str_name().to_ascii_lowercase(),
        Err(_) => format!("#{data_type}"),
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidOnnx { reason, source: None }
}

/// Dims were checked to be positive.
fn to_usize(d: i64) -> usize {
    usize::try_from(d).unwrap_or(usize::MAX)
}

fn to_i64(d: usize) -> i64 {
    i64::try_from(d).unwrap_or(i64::MAX)
}
