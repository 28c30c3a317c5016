//! OpenAI's embeddings API (`POST /v1/embeddings`) and what D-Bus `Embed` shares with it:
//! the wire's inputs to the runtime's [`EmbedInput`], its vectors back as floats or base64.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use pocket_api::{
    Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector,
};
use pocket_runtime::embed::{EmbedInput, Embedded};

use super::body::parse;
use super::error::ServeError;
use super::scheduler::Scheduler;

impl Scheduler {
    /// Embed `input` on the model named `model` (the default model when `None`), loading it
    /// if needed, as [`pocket_runtime::embed::embed`] does; the vectors and the name the model
    /// is served under.
    pub async fn embed(
        &self,
        model: Option<&str>,
        input: EmbedInput,
        truncate: bool,
        dimensions: Option<usize>,
    ) -> Result<(String, Embedded), ServeError> {
        let m = self.model_or_default(model).await?;
        let threads = self.threads();
        let served = Arc::clone(&m);
        let result = tokio::task::spawn_blocking(move || {
            pocket_runtime::embed::embed(&served.model, &input, truncate, dimensions, threads)
        })
        .await;
        self.registry.release(&m.name);
        let embedded = result
            .map_err(|e| ServeError::internal(None, format!("embedding on {} panicked: {e}", m.name)))?
            .map_err(|e| ServeError::from_runtime(e, None))?;
        Ok((m.name.clone(), embedded))
    }
}

/// `POST /v1/embeddings`.
pub(super) async fn create(
    State(s): State<Arc<Scheduler>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: EmbeddingRequest = parse(body)?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ServeError::invalid(
                "encoding_format",
                format!("encoding_format {other:?} is not one pocketd writes: float or base64"),
            ));
        }
    };
    let input = match request.input {
        EmbeddingInput::Text(t) => EmbedInput::Texts(vec![t]),
        EmbeddingInput::Texts(t) => EmbedInput::Texts(t),
        EmbeddingInput::Tokens(t) => EmbedInput::Tokens(vec![t]),
        EmbeddingInput::TokenLists(t) => EmbedInput::Tokens(t),
    };
    let (model, embedded) =
        s.embed(request.model.as_deref(), input, request.truncate, request.dimensions).await?;
    let data = embedded
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| Embedding {
            object: "embedding".into(),
            index,
            embedding: if base64 { EmbeddingVector::Base64(encode(&v)) } else { EmbeddingVector::Float(v) },
        })
        .collect();
    let usage = EmbeddingUsage {
        prompt_tokens: embedded.prompt_tokens,
        total_tokens: embedded.prompt_tokens,
        truncated_inputs: embedded.truncated,
        max_input_tokens: Some(embedded.max_tokens),
    };
    Ok(axum::Json(EmbeddingResponse { object: "list".into(), data, model, usage }).into_response())
}

/// A vector as OpenAI's base64: its little-endian f32 bytes.
fn encode(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_holds_the_little_endian_floats() {
        let s = encode(&[1.0, -2.5]);
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat());
    }
}
