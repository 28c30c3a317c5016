//! The text learning runs on when no request is there to learn from: everyday prose, so that
//! cost curves are timed on ordinary tokens and skip sets are judged on the kind of answer a
//! chat model gives.

/// A paragraph of plain prose (tokenized, it fills the context cost curves are measured at).
pub(crate) const PROSE: &str = "\
The old harbour town wakes slowly. Before sunrise the fishing boats come back with the tide, \
and the market hall fills with crates of mackerel, crabs and mussels packed in ice. Bakers \
carry trays of bread across the square while the first buses leave for the city. By eight \
o'clock the cafes along the quay have set out their tables, and visitors sit with coffee, \
watching the ferry cross to the island. The lighthouse on the northern cliff has been \
automatic for decades, but a small museum in the keeper's cottage tells its story: the storms, \
the shipwrecks, the families who lived there and kept the lamp burning through the longest \
nights of winter. In the afternoon the wind usually rises, and sailing boats race between the \
buoys outside the breakwater. Children fish from the pier with lines and buckets, and older \
residents walk along the promenade as they have done all their lives. When evening comes, the \
lights of the town reflect in the water, the restaurants fill up, and the sound of music \
drifts from the open doors of the pub near the station.";

/// What a skip-set search asks the model, one request after another, until the search ends.
pub(crate) const SEARCH_QUESTIONS: [&str; 4] = [
    "Summarize the following text in a few sentences.",
    "Write a short story that begins where the following text ends.",
    "List the places mentioned in the following text and describe each one.",
    "Rewrite the following text as a letter to a friend.",
];
