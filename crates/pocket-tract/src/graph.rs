//! One ONNX graph loaded into tract, its inputs and outputs known by their ONNX names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tract_onnx::prelude::*;
use tract_onnx::tract_hir::internal::DimLike;

use crate::Error;

/// A graph optimised for running, with the names of its inputs and outputs in order.
pub(crate) struct Graph {
    pub(crate) path: PathBuf,
    plan: Arc<TypedRunnableModel>,
    pub(crate) inputs: Vec<String>,
    pub(crate) outputs: Vec<String>,
    /// The last dimension of each output where the graph fixes it (`logits`: the vocabulary;
    /// `last_hidden_state`: the model width).
    pub(crate) output_widths: Vec<Option<usize>>,
    /// Each input's dimensions where the graph fixes them (`None` for symbolic axes).
    pub(crate) input_dims: Vec<Vec<Option<usize>>>,
}

impl Graph {
    /// Load and optimise `path`. Symbolic axes (sequence lengths) stay symbolic and are
    /// resolved from the inputs of each run.
    pub(crate) fn load(path: &Path) -> Result<Graph, Error> {
        let bad = |what: &str, e: TractError| Error::BadGraph {
            path: path.to_path_buf(),
            reason: format!("{what}: {e:#}"),
        };
        let model =
            tract_onnx::onnx().model_for_path(path).map_err(|e| bad("not a loadable ONNX graph", e))?;
        let inputs = model
            .input_outlets()
            .map_err(|e| bad("no inputs", e))?
            .iter()
            .map(|o| model.node(o.node).name.clone())
            .collect();
        // Output names are the outlet labels (the ONNX output names); node names are internal.
        let outputs = model
            .output_outlets()
            .map_err(|e| bad("no outputs", e))?
            .iter()
            .map(|&o| model.outlet_label(o).map_or_else(|| model.node(o.node).name.clone(), str::to_owned))
            .collect();
        let typed = model.into_optimized().map_err(|e| bad("cannot be optimised by tract", e))?;
        let output_widths = (0..typed.output_outlets().map(|o| o.len()).unwrap_or(0))
            .map(|i| typed.output_fact(i).ok().and_then(|f| f.shape.last().and_then(|d| d.to_usize().ok())))
            .collect();
        let input_dims = (0..typed.input_outlets().map(|o| o.len()).unwrap_or(0))
            .map(|i| {
                typed
                    .input_fact(i)
                    .map(|f| f.shape.iter().map(|d| d.to_usize().ok()).collect())
                    .unwrap_or_default()
            })
            .collect();
        let plan = typed.into_runnable().map_err(|e| bad("cannot be planned by tract", e))?;
        Ok(Graph { path: path.to_path_buf(), plan, inputs, outputs, output_widths, input_dims })
    }

    /// The position of input `name`.
    pub(crate) fn input(&self, name: &str) -> Option<usize> {
        self.inputs.iter().position(|n| n == name)
    }

    /// The position of output `name`.
    pub(crate) fn output(&self, name: &str) -> Option<usize> {
        self.outputs.iter().position(|n| n == name)
    }

    /// An error about this graph.
    pub(crate) fn error(&self, reason: impl Into<String>) -> Error {
        Error::BadGraph { path: self.path.clone(), reason: reason.into() }
    }

    /// Run with `inputs` given in the graph's input order.
    pub(crate) fn run(&self, inputs: TVec<TValue>) -> pocket_core::Result<TVec<TValue>> {
        self.plan.run(inputs).map_err(|e| {
            pocket_core::Error::engine(format!(
                "tract failed running {}: {e:#}",
                self.path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
            ))
        })
    }

    /// "a, b, c" of the inputs, for messages.
    pub(crate) fn input_list(&self) -> String {
        self.inputs.join(", ")
    }

    /// "a, b, c" of the outputs, for messages.
    pub(crate) fn output_list(&self) -> String {
        let mut shown: Vec<&str> = self.outputs.iter().take(6).map(String::as_str).collect();
        if self.outputs.len() > 6 {
            shown.push("...");
        }
        shown.join(", ")
    }
}
