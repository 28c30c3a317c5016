//! OpenAI's Responses API as the `openai` client libraries speak it: `POST /v1/responses`
//! (input as text or items, function tools, `text.format`, streaming as semantic events,
//! stored responses continued by `previous_response_id`), `GET` and `DELETE
//! /v1/responses/{id}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `POST /v1/responses`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    /// The model (the daemon's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What to answer: a user's text, or items (messages, function calls and their outputs).
    pub input: ResponsesInput,
    /// A system message put before the input (not carried over by `previous_response_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Function tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<FunctionTool>,
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "name": …}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one answer (true by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The answer's format (`text.format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextOptions>,
    /// The most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature (0, greedy, by default here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Accepted and ignored (`include_obfuscation`: pocketd's events carry no padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<Value>,
    /// Keep the response for `previous_response_id` and `GET` (true by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Continue the conversation of a stored response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    /// Returned with the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The end user: the prompt cache's key when `prompt_cache_key` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Which parked conversations the prompt cache may continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    /// Accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety_identifier: Option<String>,
    /// Accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// `"disabled"` (a prompt over the context is refused) or `"auto"` (refused too: pocketd
    /// never drops a conversation's turns silently).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<String>,
    /// Accepted; models that do not think ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Value>,
    /// Extra output to include; pocketd includes nothing more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Run in the background (refused: pocketd answers while the request is open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    /// pocketd's extension: the sampler's seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// `input`: a user's text, or items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Items, read one by one by [`InputItem::from_value`] (so that an error names the item).
    Items(Vec<Value>),
}

/// One input item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    /// A message (`type` may be left out).
    Message {
        /// `user`, `assistant`, `system` or `developer`.
        role: String,
        /// Its text, or parts.
        content: MessageContent,
    },
    /// A call the model made, sent back with the conversation.
    FunctionCall {
        /// The call's id, which its output names.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments as JSON text.
        arguments: String,
    },
    /// A call's result.
    FunctionCallOutput {
        /// The call it answers.
        call_id: String,
        /// The result: text, or text parts.
        output: MessageContent,
    },
    /// A reasoning item sent back with the conversation (its text is not shown again).
    Reasoning {},
}

impl InputItem {
    /// Item `index` of `input`; the error says which item and what is wrong.
    pub fn from_value(index: usize, mut value: Value) -> Result<InputItem, String> {
        if let Some(item) = value.as_object_mut() {
            item.entry("type").or_insert_with(|| Value::from("message"));
        }
        serde_json::from_value(value).map_err(|e| format!("input[{index}]: {e}"))
    }
}

/// A message's content: text, or parts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Text.
    Text(String),
    /// Parts.
    Parts(Vec<ContentPart>),
}

// By hand, so that a part pocketd does not read is named in the error ("unknown variant
// `input_image`") where an untagged enum would only say that nothing matched.
impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(text) => Ok(MessageContent::Text(text)),
            Value::Array(parts) => parts
                .into_iter()
                .map(|p| serde_json::from_value(p).map_err(D::Error::custom))
                .collect::<Result<_, _>>()
                .map(MessageContent::Parts),
            other => Err(D::Error::custom(format!("content is text or a list of parts, not {other}"))),
        }
    }
}

impl MessageContent {
    /// The text of its text parts, joined.
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::InputText { text } | ContentPart::OutputText { text } => text.as_str(),
                    ContentPart::Refusal { refusal } => refusal.as_str(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A part of a message (pocketd reads text only: images, files and audio are refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// A user's text.
    InputText {
        /// The text.
        text: String,
    },
    /// An earlier answer's text.
    OutputText {
        /// The text.
        text: String,
    },
    /// An earlier refusal.
    Refusal {
        /// Its text.
        refusal: String,
    },
}

/// A function tool (the Responses API's flat shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    /// `function` (the only kind pocketd has).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its arguments.
    #[serde(default)]
    pub parameters: Value,
    /// Whether the arguments must follow the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `text`: the answer's format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextOptions {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name",
    /// "schema", "strict"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TextFormat>,
    /// Accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
}

/// `text.format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", try_from = "RawTextFormat")]
pub enum TextFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following a schema.
    JsonSchema {
        /// The schema's name.
        #[serde(default)]
        name: String,
        /// What the format is for (the model is not shown it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// The JSON schema.
        schema: Value,
        /// Refuse schemas with keywords that cannot be enforced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

/// `text.format` as sent: serde lets unknown keys beside a unit variant's tag through, so the
/// keys are checked here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTextFormat {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    schema: Option<Value>,
    #[serde(default)]
    strict: Option<bool>,
}

impl TryFrom<RawTextFormat> for TextFormat {
    type Error = String;

    fn try_from(raw: RawTextFormat) -> Result<Self, String> {
        let plain =
            raw.name.is_none() && raw.description.is_none() && raw.schema.is_none() && raw.strict.is_none();
        match (raw.kind.as_str(), raw.schema) {
            ("text", _) if plain => Ok(TextFormat::Text),
            ("json_object", _) if plain => Ok(TextFormat::JsonObject),
            ("text" | "json_object", _) => Err(format!(
                "text.format of type {} takes no other keys: name, description, schema and strict belong to json_schema",
                raw.kind
            )),
            ("json_schema", Some(schema)) => Ok(TextFormat::JsonSchema {
                name: raw.name.unwrap_or_default(),
                description: raw.description,
                schema,
                strict: raw.strict,
            }),
            ("json_schema", None) => Err("text.format of type json_schema needs schema".into()),
            (other, _) => {
                Err(format!("text.format's type is text, json_object or json_schema, not {other:?}"))
            }
        }
    }
}

/// A response, as `POST /v1/responses` and `GET /v1/responses/{id}` return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    /// `response`.
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: String,
    /// Why it failed.
    pub error: Option<Value>,
    /// Why it is incomplete: `{"reason": "max_output_tokens"}`.
    pub incomplete_details: Option<Value>,
    /// The request's instructions.
    pub instructions: Option<String>,
    /// The request's `max_output_tokens`.
    pub max_output_tokens: Option<u32>,
    /// The model that answered.
    pub model: String,
    /// The answer: a message, function calls.
    pub output: Vec<OutputItem>,
    /// The request's `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// The response this one continued.
    pub previous_response_id: Option<String>,
    /// `{"effort": null, "summary": null}`.
    pub reasoning: Value,
    /// Whether it is kept.
    pub store: bool,
    /// The temperature it sampled at.
    pub temperature: f32,
    /// `{"format": …}` as asked.
    pub text: Value,
    /// As asked (`auto` by default).
    pub tool_choice: Value,
    /// The tools as given.
    pub tools: Vec<FunctionTool>,
    /// The top-p it sampled with.
    pub top_p: f32,
    /// `disabled`.
    pub truncation: String,
    /// Token counts (none while in progress).
    pub usage: Option<ResponsesUsage>,
    /// The request's `user`.
    pub user: Option<String>,
    /// The request's metadata.
    pub metadata: Value,
}

/// An item of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The answer's text.
    Message {
        /// `msg_…`.
        id: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: String,
        /// `assistant`.
        role: String,
        /// One `output_text` part.
        content: Vec<OutputText>,
    },
    /// A thinking model's thinking, before the answer.
    Reasoning {
        /// `rs_…`.
        id: String,
        /// Always empty (pocketd does not summarise).
        summary: Vec<Value>,
        /// One `reasoning_text` part.
        content: Vec<ReasoningText>,
    },
    /// A call of a function tool.
    FunctionCall {
        /// `fc_…`.
        id: String,
        /// The id its `function_call_output` names.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments as JSON text.
        arguments: String,
        /// `in_progress` or `completed`.
        status: String,
    },
}

/// An `output_text` part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
    /// Always empty (pocketd makes no citations).
    pub annotations: Vec<Value>,
    /// Always empty (log-probabilities are not offered here).
    pub logprobs: Vec<Value>,
}

impl OutputText {
    /// A part holding `text`.
    pub fn new(text: String) -> OutputText {
        OutputText { kind: "output_text".into(), text, annotations: Vec::new(), logprobs: Vec::new() }
    }
}

/// A `reasoning_text` part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningText {
    /// `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The thinking.
    pub text: String,
}

impl ReasoningText {
    /// A part holding `text`.
    pub fn new(text: String) -> ReasoningText {
        ReasoningText { kind: "reasoning_text".into(), text }
    }
}

/// Token counts in the Responses API's shape.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ResponsesUsage {
    /// Prompt tokens (those continued from the prompt cache included).
    pub input_tokens: u32,
    /// `{"cached_tokens"}`: prompt tokens continued from the prompt cache.
    pub input_tokens_details: InputTokensDetails,
    /// Tokens generated.
    pub output_tokens: u32,
    /// `{"reasoning_tokens"}`.
    pub output_tokens_details: OutputTokensDetails,
    /// Both.
    pub total_tokens: u32,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Prompt tokens continued from the prompt cache.
    pub cached_tokens: u32,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    /// Tokens of thinking (0 for models that do not think).
    pub reasoning_tokens: u32,
}

impl From<&crate::Usage> for ResponsesUsage {
    fn from(u: &crate::Usage) -> Self {
        ResponsesUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: u.completion_tokens_details.map_or(0, |d| d.reasoning_tokens),
            },
            total_tokens: u.total_tokens,
        }
    }
}

/// The answer of `DELETE /v1/responses/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseDeleted {
    /// The response's id.
    pub id: String,
    /// `response`.
    pub object: String,
    /// `true`.
    pub deleted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_are_read_with_or_without_a_type_and_errors_name_the_item() {
        let m = InputItem::from_value(0, json!({"role": "user", "content": "hi"})).unwrap();
        assert_eq!(m, InputItem::Message { role: "user".into(), content: MessageContent::Text("hi".into()) });
        let parts = json!({"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": "a", "annotations": []}]});
        let InputItem::Message { content, .. } = InputItem::from_value(1, parts).unwrap() else { panic!() };
        assert_eq!(content.text(), "a");
        let call =
            json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc_1"});
        assert!(matches!(InputItem::from_value(2, call).unwrap(), InputItem::FunctionCall { .. }));
        let image = json!({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]});
        let e = InputItem::from_value(3, image).unwrap_err();
        assert!(e.starts_with("input[3]") && e.contains("input_image"), "{e}");
        let e = InputItem::from_value(4, json!({"type": "web_search_call"})).unwrap_err();
        assert!(e.contains("input[4]") && e.contains("web_search_call"), "{e}");
    }

    #[test]
    fn text_formats_refuse_unknown_keys() {
        let f: TextOptions =
            serde_json::from_value(json!({"format": {"type": "json_schema", "name": "x", "schema": {}}}))
                .unwrap();
        assert!(matches!(f.format, Some(TextFormat::JsonSchema { .. })));
        assert!(
            serde_json::from_value::<TextOptions>(json!({"format": {"type": "text", "foo": 1}})).is_err()
        );
        let e =
            serde_json::from_value::<TextOptions>(json!({"format": {"type": "json_object", "schema": {}}}));
        assert!(e.unwrap_err().to_string().contains("takes no other keys"));
    }
}
