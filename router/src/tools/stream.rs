//! The incremental tool-call parser: fed the text deltas the detokenizer emits, it
//! returns OpenAI's chat delta pieces. Every decision depends only on the text so far,
//! never on where the deltas were cut, so the streamed pieces always add up to what
//! [`super::parse::parse_tool_calls`] returns for the whole text (which is this parser
//! fed the text at once).
//!
//! The rules, for every format:
//! - Free text is content. Text that could be the start of a call marker is held back
//!   until it is known not to be one, so a marker never leaks into content.
//! - Whitespace right before a call and right after one is dropped (it separates
//!   calls; it is not an answer). A text without calls is its content verbatim.
//! - A call is announced (`CallStart`: index, id, name) as soon as its name is complete;
//!   its arguments follow as `Arguments` deltas, with the whitespace between JSON tokens
//!   removed (strings untouched), in the order the model writes them. Arguments written
//!   before the name are held until the name comes. A call without arguments gets `{}`.
//! - Text that starts like a call but breaks the syntax before the name is known is
//!   content after all (marker included). A call that breaks after its name ends there;
//!   what follows is text again. Under a tool grammar neither happens; it matters for
//!   truncated output (`length`) and for unconstrained models.
use super::format::{ToolCallFormat, ToolSyntax};
use super::ids::IdGenerator;
use super::scan::{Step, ValueScanner};

/// Longest key or function name accepted while parsing (longer: not a call).
const MAX_KEY_LEN: usize = 1024;

/// One piece of a streamed chat answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolStreamEvent {
    /// More `delta.content`.
    Content(String),
    /// A new call: `delta.tool_calls[0]` = `{index, id, type: "function",
    /// function: {name, arguments: ""}}`.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More `function.arguments` of call `index`.
    Arguments { index: usize, delta: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Obj {
    Open,
    KeyOrEnd,
    Key,
    Colon,
    Value,
    Name,
    ArgsString,
    Args,
    Skip,
    CommaOrEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// Mistral v3 after `[TOOL_CALLS]`: `[` (a list of calls) or `{` (one call).
    MistralOpen,
    Object(Obj),
    AfterObject,
    V11Name,
    V11Args,
}

/// Per-call parse state.
#[derive(Debug, Default)]
struct Call {
    /// Consumed text of this call while it has no name, to give back as content.
    raw: String,
    key: String,
    str_buf: String,
    name: Option<String>,
    started: bool,
    args_seen: bool,
    pending_args: String,
    args_len: usize,
    scanner: ValueScanner,
}

/// The incremental parser; one per streamed answer.
pub struct ToolCallStream {
    format: ToolCallFormat,
    open: Option<String>,
    close: Option<String>,
    args_marker: Option<String>,
    ids: IdGenerator,
    buf: String,
    pos: usize,
    state: State,
    out: Vec<ToolStreamEvent>,
    calls: usize,
    /// Nothing but whitespace so far (Llama's calls start with a bare `{`).
    at_start: bool,
    /// Right after a call: drop the whitespace that follows.
    skip_ws: bool,
    /// Mistral v3: inside `[...]`.
    in_list: bool,
    call: Call,
}

impl std::fmt::Debug for ToolCallStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolCallStream")
            .field("format", &self.format)
            .field("state", &self.state)
            .field("calls", &self.calls)
            .finish()
    }
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Length of the longest proper prefix of `marker` that `text` ends with.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

impl ToolCallStream {
    pub fn new(syntax: &ToolSyntax, ids: IdGenerator) -> Self {
        Self {
            format: syntax.format,
            open: syntax.open.as_ref().map(|m| m.text.clone()),
            close: syntax.close.as_ref().map(|m| m.text.clone()),
            args_marker: syntax.args.as_ref().map(|m| m.text.clone()),
            ids,
            buf: String::new(),
            pos: 0,
            state: State::Text,
            out: Vec::new(),
            calls: 0,
            at_start: true,
            skip_ws: false,
            in_list: false,
            call: Call::default(),
        }
    }

    /// Calls announced so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds the next text delta; returns the pieces it completes (maybe none).
    pub fn push(&mut self, delta: &str) -> Vec<ToolStreamEvent> {
        self.buf.push_str(delta);
        self.run(false);
        self.buf.drain(..self.pos);
        self.pos = 0;
        std::mem::take(&mut self.out)
    }

    /// Ends the text: whatever was held back is resolved.
    pub fn finish(&mut self) -> Vec<ToolStreamEvent> {
        self.run(true);
        self.buf.clear();
        self.pos = 0;
        if !matches!(self.state, State::Text | State::AfterObject) {
            match self.call.started {
                true => self.end_call(),
                false => self.give_back(),
            }
        }
        self.state = State::Text;
        std::mem::take(&mut self.out)
    }

    fn rest(&self) -> &str {
        &self.buf[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    /// Consumes `c` as part of the current call.
    fn bump(&mut self, c: char) {
        self.pos += c.len_utf8();
        if !self.call.started && self.state != State::Text {
            self.call.raw.push(c);
        }
    }

    fn content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if text.chars().any(|c| !is_ws(c)) {
            self.at_start = false;
        }
        match self.out.last_mut() {
            Some(ToolStreamEvent::Content(s)) => s.push_str(text),
            _ => self.out.push(ToolStreamEvent::Content(text.to_owned())),
        }
    }

    fn args(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.call.args_len += text.len();
        if !self.call.started {
            self.call.pending_args.push_str(text);
            return;
        }
        let index = self.calls - 1;
        match self.out.last_mut() {
            Some(ToolStreamEvent::Arguments { index: i, delta }) if *i == index => {
                delta.push_str(text)
            }
            _ => self.out.push(ToolStreamEvent::Arguments {
                index,
                delta: text.to_owned(),
            }),
        }
    }

    fn begin_call(&mut self, raw: String, state: State) {
        self.call = Call {
            raw,
            ..Call::default()
        };
        self.state = state;
    }

    fn announce(&mut self, name: String) {
        let index = self.calls;
        self.calls += 1;
        self.call.started = true;
        self.call.raw.clear();
        let id = (self.ids)();
        self.out
            .push(ToolStreamEvent::CallStart { index, id, name });
        let pending = std::mem::take(&mut self.call.pending_args);
        self.call.args_len = 0;
        self.args(&pending);
    }

    /// The call is complete (or cut off): a call without arguments gets `{}`.
    fn end_call(&mut self) {
        if self.call.args_len == 0 {
            self.args("{}");
        }
        self.call = Call::default();
        self.skip_ws = true;
    }

    /// A call broke its syntax before its name: its text is content after all.
    fn give_back(&mut self) {
        let raw = std::mem::take(&mut self.call.raw);
        self.content(&raw);
        self.call = Call::default();
        self.skip_ws = false;
    }

    /// The text stops being a call here; the unconsumed rest is text again.
    fn malformed(&mut self) {
        if self.call.started {
            self.end_call();
        } else {
            self.give_back();
        }
        self.state = State::Text;
    }

    fn object_end(&mut self) {
        if !self.call.started {
            self.malformed();
            return;
        }
        self.end_call();
        self.state = State::AfterObject;
    }

    /// Skips whitespace; `false` when the buffer ran out.
    fn skip_whitespace(&mut self) -> bool {
        while let Some(c) = self.peek() {
            if !is_ws(c) {
                return true;
            }
            self.bump(c);
        }
        false
    }

    fn run(&mut self, eof: bool) {
        loop {
            let progressed = match self.state {
                State::Text => self.text(eof),
                State::MistralOpen => self.mistral_open(),
                State::Object(obj) => self.object(obj, eof),
                State::AfterObject => self.after_object(eof),
                State::V11Name => self.v11_name(eof),
                State::V11Args => self.v11_args(eof),
            };
            if !progressed {
                return;
            }
        }
    }

    /// Free text. Returns whether the state changed (so the loop goes on).
    fn text(&mut self, eof: bool) -> bool {
        if self.skip_ws {
            if !self.skip_whitespace() {
                return false;
            }
            self.skip_ws = false;
        }
        let rest = self.rest();
        if self.format == ToolCallFormat::Llama3Json && self.at_start && self.calls == 0 {
            let trimmed = rest.trim_start_matches(is_ws);
            if trimmed.starts_with('{') {
                let ws = rest[..rest.len() - trimmed.len()].to_owned();
                self.pos += ws.len();
                self.begin_call(ws, State::Object(Obj::Open));
                return true;
            }
            if trimmed.is_empty() && !eof {
                return false;
            }
        }
        let found = self
            .open
            .as_deref()
            .and_then(|open| rest.find(open).map(|i| (i, open.len())));
        if let Some((i, len)) = found {
            let before = &rest[..i];
            let kept = before.trim_end_matches(is_ws);
            let held = before[kept.len()..].to_owned();
            let marker = rest[i..i + len].to_owned();
            let kept = kept.to_owned();
            self.content(&kept);
            self.pos += i + len;
            let next = match self.format {
                ToolCallFormat::Hermes | ToolCallFormat::Llama3Json => State::Object(Obj::Open),
                ToolCallFormat::Mistral => State::MistralOpen,
                ToolCallFormat::MistralV11 => State::V11Name,
            };
            self.begin_call(held + &marker, next);
            return true;
        }
        if eof {
            let all = rest.to_owned();
            self.content(&all);
            self.pos = self.buf.len();
            return false;
        }
        let hold = self
            .open
            .as_deref()
            .map_or(0, |open| partial_suffix(rest, open));
        let safe = &rest[..rest.len() - hold];
        let emit = safe.trim_end_matches(is_ws).to_owned();
        self.pos += emit.len();
        self.content(&emit);
        false
    }

    fn mistral_open(&mut self) -> bool {
        if !self.skip_whitespace() {
            return false;
        }
        match self.peek() {
            Some('[') => {
                self.bump('[');
                self.in_list = true;
                self.state = State::Object(Obj::Open);
            }
            Some('{') => {
                self.in_list = false;
                self.state = State::Object(Obj::Open);
            }
            _ => self.malformed(),
        }
        true
    }

    /// Reads a JSON string into `call.str_buf` (quotes included); `Some(true)` when it
    /// closed, `Some(false)` when the buffer ran out, `None` when it is too long.
    fn read_string(&mut self, into_key: bool) -> Option<bool> {
        while let Some(c) = self.peek() {
            self.bump(c);
            let buf = if into_key {
                &mut self.call.key
            } else {
                &mut self.call.str_buf
            };
            buf.push(c);
            if into_key && buf.len() > MAX_KEY_LEN {
                return None;
            }
            if c == '"' && buf.len() > 1 {
                let backslashes = buf[..buf.len() - 1]
                    .chars()
                    .rev()
                    .take_while(|&b| b == '\\')
                    .count();
                if backslashes % 2 == 0 {
                    return Some(true);
                }
            }
        }
        Some(false)
    }

    /// After optional whitespace, `c` must come next; then the object goes on in `next`.
    /// False while more text is needed.
    fn expect(&mut self, c: char, next: Obj) -> bool {
        if !self.skip_whitespace() {
            return false;
        }
        if self.peek() == Some(c) {
            self.bump(c);
            self.state = State::Object(next);
        } else {
            self.malformed();
        }
        true
    }

    fn object(&mut self, obj: Obj, eof: bool) -> bool {
        match obj {
            Obj::Open => self.expect('{', Obj::KeyOrEnd),
            Obj::KeyOrEnd => {
                if !self.skip_whitespace() {
                    return false;
                }
                match self.peek() {
                    Some('"') => {
                        self.bump('"');
                        self.call.key = "\"".into();
                        self.state = State::Object(Obj::Key);
                    }
                    Some('}') => {
                        self.bump('}');
                        self.object_end();
                    }
                    _ => self.malformed(),
                }
                true
            }
            Obj::Key => match self.read_string(true) {
                None => {
                    self.malformed();
                    true
                }
                Some(false) => false,
                Some(true) => {
                    self.state = State::Object(Obj::Colon);
                    true
                }
            },
            Obj::Colon => self.expect(':', Obj::Value),
            Obj::Value => {
                if !self.skip_whitespace() {
                    return false;
                }
                let key: Option<String> = serde_json::from_str(&self.call.key).ok();
                let c = self.peek().unwrap_or(' ');
                let next = match key.as_deref() {
                    None => None,
                    Some("name") if self.call.name.is_none() && !self.call.started => {
                        (c == '"').then_some(Obj::Name)
                    }
                    Some("arguments" | "parameters") if !self.call.args_seen => {
                        self.call.args_seen = true;
                        Some(if c == '"' { Obj::ArgsString } else { Obj::Args })
                    }
                    Some(_) => Some(Obj::Skip),
                };
                match next {
                    None => self.malformed(),
                    Some(next) => {
                        if matches!(next, Obj::Name | Obj::ArgsString) {
                            self.bump('"');
                            self.call.str_buf = "\"".into();
                        }
                        self.call.scanner = ValueScanner::new();
                        self.state = State::Object(next);
                    }
                }
                true
            }
            Obj::Name => match self.read_string(false) {
                None => unreachable!("only keys are capped"),
                Some(false) if self.call.str_buf.len() > MAX_KEY_LEN => {
                    self.malformed();
                    true
                }
                Some(false) => false,
                Some(true) => {
                    match serde_json::from_str::<String>(&self.call.str_buf) {
                        Ok(name) if !name.is_empty() && name.len() <= MAX_KEY_LEN => {
                            self.announce(name);
                            self.state = State::Object(Obj::CommaOrEnd);
                        }
                        _ => self.malformed(),
                    }
                    true
                }
            },
            Obj::ArgsString => match self.read_string(false) {
                None | Some(false) => false,
                Some(true) => {
                    match serde_json::from_str::<String>(&self.call.str_buf) {
                        Ok(args) => {
                            self.args(&args);
                            self.state = State::Object(Obj::CommaOrEnd);
                        }
                        Err(_) => self.malformed(),
                    }
                    true
                }
            },
            Obj::Args | Obj::Skip => {
                let emit = obj == Obj::Args;
                let mut kept = String::new();
                let mut next = None;
                while let Some(c) = self.peek() {
                    match self.call.scanner.feed(c) {
                        Step::Keep => {
                            self.bump(c);
                            kept.push(c);
                        }
                        Step::Drop => self.bump(c),
                        Step::Done => {
                            self.bump(c);
                            kept.push(c);
                            next = Some(true);
                            break;
                        }
                        Step::End => {
                            next = Some(true);
                            break;
                        }
                        Step::Error => {
                            next = Some(false);
                            break;
                        }
                    }
                }
                if emit {
                    self.args(&kept);
                }
                match next {
                    Some(true) => {
                        self.state = State::Object(Obj::CommaOrEnd);
                        true
                    }
                    Some(false) => {
                        self.malformed();
                        true
                    }
                    None if eof && self.call.scanner.in_scalar() => {
                        self.state = State::Object(Obj::CommaOrEnd);
                        true
                    }
                    None => false,
                }
            }
            Obj::CommaOrEnd => {
                if !self.skip_whitespace() {
                    return false;
                }
                match self.peek() {
                    Some(',') => {
                        self.bump(',');
                        self.state = State::Object(Obj::KeyOrEnd);
                    }
                    Some('}') => {
                        self.bump('}');
                        self.object_end();
                    }
                    _ => self.malformed(),
                }
                true
            }
        }
    }

    fn after_object(&mut self, eof: bool) -> bool {
        match self.format {
            ToolCallFormat::Hermes => {
                let close = self.close.clone().unwrap_or_default();
                let rest = self.rest();
                let trimmed = rest.trim_start_matches(is_ws);
                if trimmed.starts_with(&close) {
                    self.pos += rest.len() - trimmed.len() + close.len();
                } else if !eof && close.starts_with(trimmed) {
                    return false;
                }
                self.state = State::Text;
                self.skip_ws = true;
                true
            }
            ToolCallFormat::Llama3Json => {
                let rest = self.rest();
                let trimmed = rest.trim_start_matches(is_ws);
                if trimmed.is_empty() && !eof {
                    return false;
                }
                if trimmed.starts_with(';') {
                    self.pos += rest.len() - trimmed.len() + 1;
                    self.begin_call(";".into(), State::Object(Obj::Open));
                } else {
                    self.state = State::Text;
                    self.skip_ws = true;
                }
                true
            }
            ToolCallFormat::Mistral if self.in_list => {
                let rest = self.rest();
                let trimmed = rest.trim_start_matches(is_ws);
                if trimmed.is_empty() && !eof {
                    return false;
                }
                let ws = rest.len() - trimmed.len();
                if trimmed.starts_with(',') {
                    self.pos += ws + 1;
                    self.begin_call(",".into(), State::Object(Obj::Open));
                } else {
                    if trimmed.starts_with(']') {
                        self.pos += ws + 1;
                    }
                    self.in_list = false;
                    self.state = State::Text;
                    self.skip_ws = true;
                }
                true
            }
            ToolCallFormat::Mistral | ToolCallFormat::MistralV11 => {
                self.state = State::Text;
                self.skip_ws = true;
                true
            }
        }
    }

    fn v11_name(&mut self, eof: bool) -> bool {
        let marker = self.args_marker.clone().unwrap_or_else(|| "[ARGS]".into());
        loop {
            let rest = self.rest();
            if rest.starts_with(&marker) {
                let name = self.call.str_buf.trim().to_owned();
                self.pos += marker.len();
                if name.is_empty() {
                    self.call.raw.push_str(&marker);
                    self.malformed();
                } else {
                    self.announce(name);
                    self.state = State::V11Args;
                }
                return true;
            }
            let Some(c) = rest.chars().next() else {
                return false;
            };
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                if self.call.str_buf.len() >= MAX_KEY_LEN {
                    self.malformed();
                    return true;
                }
                self.bump(c);
                self.call.str_buf.push(c);
                continue;
            }
            if !eof && marker.starts_with(rest) {
                return false;
            }
            self.malformed();
            return true;
        }
    }

    fn v11_args(&mut self, eof: bool) -> bool {
        if !self.call.scanner.in_scalar() && self.call.args_len == 0 && !self.skip_whitespace() {
            return false;
        }
        let mut kept = String::new();
        let mut next = None;
        while let Some(c) = self.peek() {
            match self.call.scanner.feed(c) {
                Step::Keep => {
                    self.bump(c);
                    kept.push(c);
                }
                Step::Drop => self.bump(c),
                Step::Done => {
                    self.bump(c);
                    kept.push(c);
                    next = Some(true);
                    break;
                }
                Step::End | Step::Error => {
                    next = Some(true);
                    break;
                }
            }
        }
        self.args(&kept);
        match next {
            Some(_) => {
                self.end_call();
                self.state = State::Text;
                true
            }
            None if eof => {
                self.end_call();
                self.state = State::Text;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
