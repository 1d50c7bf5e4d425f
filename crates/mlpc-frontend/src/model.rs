//! model.json (format version 1) to a verified graph.
//!
//! Reading goes in a fixed order, and the first problem found is reported: the format version,
//! the top-level keys, `name`/`dtype`/`allow_tf32`/`seed`, the weight source (`weights` file or
//! `params`), `inputs`, then the body (`nodes` + `outputs`, or `layers`), then `sparsity`, and
//! finally the IR verifier (whose failure would be a bug here, since everything it checks has been
//! checked before with a better message).
//!
//! Names share one namespace: model inputs, nodes, layer results, `params` and the tensors of the
//! weights file. In the graph form a node may name a node defined later in the list; the nodes are
//! built in a topological order (source order among ready nodes), and a cycle is reported with the
//! names on it. Only weights that something uses become graph nodes.

use crate::error::{FrontendError, Hint, ModelError};
use crate::generate::{self, MAX_GENERATED_ELEMENTS};
use crate::json::{self, describe, Loc};
use crate::tensors::TensorFile;
use crate::{Model, SparsitySpec};
use mlpc_ir::{is_valid_symbol, Activation, DType, Dim, Graph, HostTensor, NodeId, Op, TensorType};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The model.json format version this crate reads.
pub const FORMAT_VERSION: u64 = 1;

const TOP_KEYS: &[&str] = &[
    "mlpc",
    "name",
    "dtype",
    "allow_tf32",
    "weights",
    "seed",
    "params",
    "inputs",
    "nodes",
    "outputs",
    "layers",
    "sparsity",
];

const NODE_OPS: &str = "transpose, matmul, add, mul, relu, gelu, gelu_tanh, silu, sigmoid, tanh";
const LAYER_OPS: &str = "linear, relu, gelu, gelu_tanh, silu, sigmoid, tanh";

type R<T> = Result<T, FrontendError>;

/// The model text and its name, for errors.
struct Reader<'a> {
    file: &'a str,
    src: &'a str,
}

impl Reader<'_> {
    fn err(&self, at: &Loc, error: ModelError) -> FrontendError {
        FrontendError::Model {
            file: self.file.to_string(),
            at: at.to_string(),
            pos: if at.is_root() {
                None
            } else {
                at.line_col(self.src)
            },
            error: Box::new(error),
        }
    }

    fn ty(&self, at: &Loc, expected: &'static str, v: &Value) -> FrontendError {
        self.err(
            at,
            ModelError::Type {
                expected,
                found: describe(v),
            },
        )
    }

    fn obj<'v>(&self, v: &'v Value, at: &Loc, expected: &'static str) -> R<&'v Map<String, Value>> {
        v.as_object().ok_or_else(|| self.ty(at, expected, v))
    }

    fn arr<'v>(&self, v: &'v Value, at: &Loc, expected: &'static str) -> R<&'v Vec<Value>> {
        v.as_array().ok_or_else(|| self.ty(at, expected, v))
    }

    fn str<'v>(&self, v: &'v Value, at: &Loc, expected: &'static str) -> R<&'v str> {
        v.as_str().ok_or_else(|| self.ty(at, expected, v))
    }

    fn required<'v>(
        &self,
        m: &'v Map<String, Value>,
        at: &Loc,
        key: &'static str,
        expected: &'static str,
    ) -> R<&'v Value> {
        m.get(key)
            .ok_or_else(|| self.err(at, ModelError::MissingKey { key, expected }))
    }

    /// Refuses keys outside `known`: a misspelt key must not be silently ignored.
    fn keys(&self, m: &Map<String, Value>, at: &Loc, known: &[&str]) -> R<()> {
        for k in m.keys() {
            if !known.contains(&k.as_str()) {
                let list: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
                return Err(self.err(
                    &at.key(k),
                    ModelError::UnknownKey {
                        key: k.clone(),
                        hint: closest(k, known.iter().copied()),
                        known: list.join(", "),
                    },
                ));
            }
        }
        Ok(())
    }

    /// A name of a node, input or tensor: non-empty, no whitespace or control characters.
    fn name<'v>(&self, v: &'v Value, at: &Loc) -> R<&'v str> {
        let s = self.str(v, at, "a name (a string)")?;
        check_name(s).map_err(|reason| {
            self.err(
                at,
                ModelError::Name {
                    name: s.to_string(),
                    reason,
                },
            )
        })?;
        Ok(s)
    }

    /// A dimension: a positive integer, or (when `symbols`) a symbol name.
    fn dim(&self, v: &Value, at: &Loc, symbols: bool) -> R<Dim> {
        let bad = |found: String, reason: &str| {
            self.err(
                at,
                ModelError::Dim {
                    found,
                    reason: reason.to_string(),
                },
            )
        };
        match v {
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    return if u == 0 {
                        Err(bad("0".into(), "a dimension is at least 1"))
                    } else {
                        Ok(Dim::Fixed(u))
                    };
                }
                if n.is_i64() {
                    return Err(bad(n.to_string(), "a dimension is a positive integer"));
                }
                let f = n.as_f64().unwrap_or(f64::NAN);
                Err(if f.fract() != 0.0 {
                    bad(n.to_string(), "a dimension is an integer")
                } else if f.abs() >= 18_446_744_073_709_551_616.0 {
                    bad(n.to_string(), "too large: a dimension fits in 64 bits")
                } else if f < 0.0 {
                    bad(n.to_string(), "a dimension is a positive integer")
                } else {
                    bad(
                        n.to_string(),
                        "write a dimension as an integer, without a fraction or exponent",
                    )
                })
            }
            Value::String(s) if symbols => {
                if is_valid_symbol(s) {
                    Ok(Dim::sym(s))
                } else {
                    let extra = if s.trim().parse::<f64>().is_ok() {
                        " (write a fixed dimension as a number, without quotes)"
                    } else {
                        ""
                    };
                    Err(self.err(
                        at,
                        ModelError::Symbol {
                            name: s.clone(),
                            extra,
                        },
                    ))
                }
            }
            Value::String(s) => Err(bad(
                format!("{s:?}"),
                "this dimension is fixed: write a positive integer",
            )),
            other => Err(self.ty(
                at,
                if symbols {
                    "a dimension: a positive integer or a symbol name"
                } else {
                    "a dimension: a positive integer"
                },
                other,
            )),
        }
    }

    fn shape(&self, v: &Value, at: &Loc, symbols: bool) -> R<Vec<Dim>> {
        let dims = self.arr(
            v,
            at,
            if symbols {
                "a shape: an array of positive integers and symbol names"
            } else {
                "a shape: an array of positive integers"
            },
        )?;
        if dims.is_empty() {
            return Err(self.err(
                at,
                ModelError::Empty {
                    what: "the shape",
                    expected: "at least one dimension",
                },
            ));
        }
        dims.iter()
            .enumerate()
            .map(|(i, d)| self.dim(d, &at.index(i), symbols))
            .collect()
    }

    fn fixed_shape(&self, v: &Value, at: &Loc) -> R<Vec<u64>> {
        let s = self.shape(v, at, false)?;
        Ok(s.iter().filter_map(Dim::fixed).collect())
    }
}

fn check_name(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        Err("a name is not empty")
    } else if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Err("a name has no whitespace or control characters")
    } else if s == "__metadata__" {
        // Inputs, outputs and weights are written to safetensors files under their names.
        Err("the safetensors format reserves `__metadata__` for its header's metadata")
    } else {
        Ok(())
    }
}

fn shape_text(dims: &[Dim]) -> String {
    let v: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(", "))
}

fn fixed_text(dims: &[u64]) -> String {
    let v: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// The candidate closest to `s` in edit distance, if close enough to be a likely typo.
fn closest<'c>(s: &str, candidates: impl IntoIterator<Item = &'c str>) -> Hint {
    // Names shorter than three characters get no hint: every short name is "close" to them.
    // Names longer than HINT_MAX_CHARS get none either: the distance table grows with the
    // product of the lengths. A candidate whose length differs by more than the distance allowed
    // is not measured.
    const HINT_MAX_CHARS: usize = 256;
    let len = s.chars().count();
    if len > HINT_MAX_CHARS {
        return Hint(None);
    }
    let max = len / 3;
    let best = candidates
        .into_iter()
        .filter(|c| c.chars().count().abs_diff(len) <= max)
        .map(|c| (edit_distance(s, c), c))
        .filter(|&(d, c)| d <= max && c != s)
        .min();
    Hint(best.map(|(_, c)| c.to_string()))
}

/// Edit distance counting insertions, deletions, substitutions and swaps of adjacent characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// Where a name was defined, for duplicate-name messages.
enum Def {
    Input(Loc),
    Node(Loc),
    Param(Loc),
    Layer(Loc),
}

/// Where weights come from.
enum Weights {
    /// A safetensors file, `shown` as written in the model.
    File {
        shown: String,
        file: TensorFile,
        names: BTreeSet<String>,
    },
    /// Shapes declared in `params`, generated from the seed when used.
    Params(BTreeMap<String, Vec<u64>>),
}

impl Weights {
    fn contains(&self, name: &str) -> bool {
        match self {
            Weights::File { names, .. } => names.contains(name),
            Weights::Params(p) => p.contains_key(name),
        }
    }

    fn describe(&self) -> String {
        match self {
            Weights::File { shown, .. } => format!("a tensor of `{shown}`"),
            Weights::Params(_) => "declared in `params`".into(),
        }
    }
}

struct Builder<'a> {
    r: &'a Reader<'a>,
    g: Graph,
    dtype: DType,
    seed: u64,
    weights: Option<Weights>,
    /// Whether weights are zeros of their dtype and shape instead of their values (read or
    /// generated): [`crate::load_model_zeroed`].
    zeroed: bool,
    defs: BTreeMap<String, Def>,
    inputs: BTreeMap<String, NodeId>,
    weight_ids: BTreeMap<String, NodeId>,
    transposes: BTreeMap<String, NodeId>,
}

impl Builder<'_> {
    /// Claims `name` for a new input, node, parameter or layer result.
    fn define(&mut self, name: &str, def: Def, at: &Loc) -> R<()> {
        let first = match self.defs.get(name) {
            Some(Def::Input(l)) => Some(format!("the name of the model input at `{l}`")),
            Some(Def::Node(l)) => Some(format!("the name of the node at `{l}`")),
            Some(Def::Param(l)) => Some(format!("the name of the parameter at `{l}`")),
            Some(Def::Layer(l)) => Some(format!("a name made by the layer at `{l}`")),
            None => match &self.weights {
                Some(w @ Weights::File { .. }) if w.contains(name) => {
                    Some(format!("the name of {}", w.describe()))
                }
                _ => None,
            },
        };
        if let Some(first) = first {
            return Err(self.r.err(
                at,
                ModelError::Duplicate {
                    name: name.to_string(),
                    first,
                },
            ));
        }
        self.defs.insert(name.to_string(), def);
        Ok(())
    }

    /// Generates a tensor uniform in `[-bound, bound)` from the seed and its name (zeros if the
    /// weights are [`Builder::zeroed`], after the same check of the size).
    fn generate(&self, name: &str, shape: &[u64], bound: f64, at: &Loc) -> R<HostTensor> {
        let made = if self.zeroed {
            generate::checked_numel(shape)
                .ok_or(generate::GenError::TooLarge)
                .and_then(|_| {
                    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
                    generate::zeros(self.dtype, &dims)
                })
        } else {
            generate::uniform_tensor(self.seed, name, shape, bound, self.dtype)
        };
        made.map_err(|e| self.gen_err(format!("the generated tensor `{name}`"), shape, e, at))
    }

    /// The error of a weight `what` of `shape` that could not be made.
    fn gen_err(
        &self,
        what: String,
        shape: &[u64],
        e: generate::GenError,
        at: &Loc,
    ) -> FrontendError {
        let name = format!("{what} {}", fixed_text(shape));
        let error = match e {
            generate::GenError::TooLarge => ModelError::TooLarge {
                name,
                elements: shape
                    .iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .map_or_else(|| "more than 2^64".to_string(), |n| n.to_string()),
                limit: MAX_GENERATED_ELEMENTS,
            },
            generate::GenError::NoMemory { bytes } => ModelError::NoMemory {
                name,
                bytes,
                held: self
                    .g
                    .weights()
                    .values()
                    .map(|t| t.bytes().len() as u64)
                    .sum(),
            },
        };
        self.r.err(at, error)
    }

    fn add_weight(&mut self, name: &str, data: HostTensor, at: &Loc) -> R<NodeId> {
        let id = self
            .g
            .add_weight(name, data)
            .map_err(|e| self.r.err(at, ModelError::Build(e)))?;
        self.weight_ids.insert(name.to_string(), id);
        Ok(id)
    }

    /// The weight node named `name`, made on first use from the weights file or `params`; `None`
    /// if no weight has that name.
    fn weight(&mut self, name: &str, at: &Loc) -> R<Option<NodeId>> {
        if let Some(&id) = self.weight_ids.get(name) {
            return Ok(Some(id));
        }
        let data = match &self.weights {
            Some(Weights::File { file, .. }) => {
                let data_err = |e| self.r.err(at, ModelError::WeightData(Box::new(e)));
                let (shape, values) = if self.zeroed {
                    match file.shape(name) {
                        None => return Ok(None),
                        Some(shape) => (shape.map_err(data_err)?, None),
                    }
                } else {
                    match file.get_as(name, Some(self.dtype)) {
                        None => return Ok(None),
                        Some(t) => {
                            let t = t.map_err(data_err)?;
                            (t.shape().to_vec(), Some(t))
                        }
                    }
                };
                if shape.contains(&0) {
                    return Err(self.r.err(
                        at,
                        ModelError::WeightShape {
                            name: name.to_string(),
                            expected: "every dimension at least 1".into(),
                            actual: format!("{shape:?}"),
                        },
                    ));
                }
                match values {
                    Some(t) => t,
                    None => generate::zeros(self.dtype, &shape).map_err(|e| {
                        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
                        self.gen_err(format!("the weight `{name}`"), &dims, e, at)
                    })?,
                }
            }
            Some(Weights::Params(p)) => match p.get(name) {
                None => return Ok(None),
                Some(shape) => {
                    let shape = shape.clone();
                    let fan_in = shape.last().copied().unwrap_or(1) as f64;
                    self.generate(name, &shape, 1.0 / fan_in.sqrt(), at)?
                }
            },
            None => return Ok(None),
        };
        self.add_weight(name, data, at).map(Some)
    }

    fn weights_desc(&self) -> String {
        match &self.weights {
            Some(w) => format!(
                "a weight ({})",
                w.describe().replace("a tensor of", "tensors of")
            ),
            None => "a weight (the model has no `weights` file or `params`)".into(),
        }
    }

    fn add(&mut self, name: &str, op: Op, operands: &[NodeId], at: &Loc) -> R<NodeId> {
        self.g
            .add(name, op, operands)
            .map_err(|e| self.r.err(at, ModelError::Build(e)))
    }

    /// Every name a user could have meant, for "did you mean" hints.
    fn known_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.defs.keys().cloned().collect();
        if let Some(Weights::File { names, .. }) = &self.weights {
            v.extend(names.iter().cloned());
        }
        v
    }
}

fn parse_op(s: &str) -> Option<Op> {
    Some(match s {
        "transpose" => Op::Transpose,
        "matmul" => Op::MatMul,
        "add" => Op::Add,
        "mul" => Op::Mul,
        _ => Op::Act(Activation::parse(s)?),
    })
}

fn op_names(list: &str) -> impl Iterator<Item = &str> {
    list.split(", ")
}

/// Parses and builds a model; see the module documentation. With `zeroed`, every weight holds
/// zeros of its dtype and shape ([`crate::load_model_zeroed`]).
pub(crate) fn parse(
    json: &str,
    base_dir: &Path,
    file: &str,
    source: PathBuf,
    zeroed: bool,
) -> R<Model> {
    let r = Reader { file, src: json };
    let root = json::parse_strict(json).map_err(|e| FrontendError::Syntax {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        message: if json.starts_with('\u{feff}') {
            "the file starts with a UTF-8 byte-order mark; save it as UTF-8 without one".into()
        } else if json.trim().is_empty() {
            "the file is empty; expected a JSON object holding the model".into()
        } else {
            json::syntax_message(&e)
        },
    })?;
    let top_at = Loc::root();
    let top = r.obj(&root, &top_at, "a JSON object holding the model")?;

    match top.get("mlpc") {
        None => return Err(r.err(&top_at, ModelError::MissingVersion)),
        Some(v) if v.as_u64() == Some(FORMAT_VERSION) => {}
        Some(v) => {
            return Err(r.err(
                &top_at.key("mlpc"),
                ModelError::UnsupportedVersion {
                    found: v.to_string(),
                },
            ))
        }
    }
    r.keys(top, &top_at, TOP_KEYS)?;

    let name = match top.get("name") {
        Some(v) => r.name(v, &top_at.key("name"))?.to_string(),
        None => Path::new(file)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .filter(|s| check_name(s).is_ok())
            .unwrap_or_else(|| "model".into()),
    };
    let dtype_v = r.required(top, &top_at, "dtype", "\"f32\", \"f16\" or \"bf16\"")?;
    let dtype = parse_dtype(&r, dtype_v, &top_at.key("dtype"))?;
    let allow_tf32 = match top.get("allow_tf32") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| r.ty(&top_at.key("allow_tf32"), "true or false", v))?,
    };
    let seed = match top.get("seed") {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| r.ty(&top_at.key("seed"), "a non-negative integer seed", v))?,
    };

    let mut b = Builder {
        r: &r,
        g: Graph::new(name),
        dtype,
        seed,
        weights: None,
        zeroed,
        defs: BTreeMap::new(),
        inputs: BTreeMap::new(),
        weight_ids: BTreeMap::new(),
        transposes: BTreeMap::new(),
    };

    if let (Some(_), Some(_)) = (top.get("weights"), top.get("params")) {
        return Err(r.err(
            &top_at.key("params"),
            ModelError::Conflict {
                message: "`params` declares generated weights, but the model loads its weights \
                          from the `weights` file; give one or the other"
                    .into(),
            },
        ));
    }
    if let Some(v) = top.get("weights") {
        let at = top_at.key("weights");
        let shown = r.str(v, &at, "a path to a safetensors file (a string)")?;
        if shown.is_empty() {
            return Err(r.err(
                &at,
                ModelError::Empty {
                    what: "the weights path",
                    expected: "a path to a safetensors file",
                },
            ));
        }
        let file = TensorFile::open(&base_dir.join(shown))
            .map_err(|e| r.err(&at, ModelError::WeightsFile(Box::new(e))))?;
        b.weights = Some(Weights::File {
            shown: shown.to_string(),
            names: file.names().cloned().collect(),
            file,
        });
    }
    if let Some(v) = top.get("params") {
        let at = top_at.key("params");
        let m = r.obj(v, &at, "an object mapping weight names to shapes")?;
        let mut params = BTreeMap::new();
        for (k, shape) in m {
            let kat = at.key(k);
            check_name(k).map_err(|reason| {
                r.err(
                    &kat,
                    ModelError::Name {
                        name: k.clone(),
                        reason,
                    },
                )
            })?;
            let dims = r.fixed_shape(shape, &kat)?;
            b.define(k, Def::Param(kat), &at.key(k))?;
            params.insert(k.clone(), dims);
        }
        b.weights = Some(Weights::Params(params));
    }

    let inputs_at = top_at.key("inputs");
    let inputs_v = r.required(
        top,
        &top_at,
        "inputs",
        "an object mapping input names to shapes",
    )?;
    let inputs_m = r.obj(
        inputs_v,
        &inputs_at,
        "an object mapping input names to {\"shape\": [...]}",
    )?;
    if inputs_m.is_empty() {
        return Err(r.err(
            &inputs_at,
            ModelError::Empty {
                what: "`inputs`",
                expected: "at least one model input",
            },
        ));
    }
    let mut input_order = Vec::new();
    for (k, v) in inputs_m {
        let at = inputs_at.key(k);
        check_name(k).map_err(|reason| {
            r.err(
                &at,
                ModelError::Name {
                    name: k.clone(),
                    reason,
                },
            )
        })?;
        let m = r.obj(v, &at, "an object {\"shape\": [...]}")?;
        r.keys(m, &at, &["shape", "dtype"])?;
        let shape_v = r.required(
            m,
            &at,
            "shape",
            "an array of positive integers and symbol names",
        )?;
        let shape = r.shape(shape_v, &at.key("shape"), true)?;
        if let Some(dv) = m.get("dtype") {
            let found = parse_dtype(&r, dv, &at.key("dtype"))?;
            if found != dtype {
                return Err(r.err(
                    &at.key("dtype"),
                    ModelError::InputDType {
                        input: k.clone(),
                        expected: dtype,
                        found,
                    },
                ));
            }
        }
        let ty = TensorType::try_contiguous(dtype, shape.clone()).ok_or_else(|| {
            r.err(
                &at.key("shape"),
                ModelError::Overflow {
                    shape: shape_text(&shape),
                },
            )
        })?;
        b.define(k, Def::Input(at.clone()), &at)?;
        let id = b.g.add_input(k.clone(), ty);
        b.inputs.insert(k.clone(), id);
        input_order.push(id);
    }

    match (top.get("layers"), top.get("nodes"), top.get("outputs")) {
        (Some(_), Some(_), _) => {
            return Err(r.err(
                &top_at.key("layers"),
                ModelError::Conflict {
                    message: "a model has either `layers` (sequential form) or `nodes` and \
                              `outputs` (graph form), not both"
                        .into(),
                },
            ))
        }
        (Some(_), None, Some(_)) => {
            return Err(r.err(
                &top_at.key("outputs"),
                ModelError::Conflict {
                    message: "`outputs` belongs to the graph form; a `layers` model has one \
                              output, named `y`"
                        .into(),
                },
            ))
        }
        (Some(layers), None, None) => layers_form(&mut b, layers, &input_order)?,
        (None, Some(nodes), Some(outputs)) => graph_form(&mut b, nodes, outputs)?,
        (None, Some(_), None) => {
            return Err(r.err(
                &top_at,
                ModelError::MissingKey {
                    key: "outputs",
                    expected: "the list of node names the model returns",
                },
            ))
        }
        (None, None, _) => {
            return Err(r.err(
                &top_at,
                ModelError::MissingKey {
                    key: "nodes",
                    expected: "`nodes` and `outputs` (graph form) or `layers` (sequential form)",
                },
            ))
        }
    }

    let sparsity = match top.get("sparsity") {
        None => Vec::new(),
        Some(v) => sparsity(&b, v, &top_at.key("sparsity"))?,
    };

    let graph = b.g;
    mlpc_ir::verify(&graph).map_err(|source| FrontendError::Verify {
        file: file.to_string(),
        source,
    })?;
    Ok(Model {
        graph,
        sparsity,
        allow_tf32,
        source,
    })
}

fn parse_dtype(r: &Reader<'_>, v: &Value, at: &Loc) -> R<DType> {
    let s = r.str(v, at, "a dtype: \"f32\", \"f16\" or \"bf16\"")?;
    DType::parse(s).ok_or_else(|| {
        r.err(
            at,
            ModelError::DType {
                found: s.to_string(),
            },
        )
    })
}

/// A reference from a node to one of its inputs.
enum Dep {
    Node(usize),
    Input(NodeId),
    Weight(String),
}

struct JsonNode<'v> {
    name: &'v str,
    op: Op,
    deps: Vec<Dep>,
    at: Loc,
}

fn graph_form(b: &mut Builder<'_>, nodes_v: &Value, outputs_v: &Value) -> R<()> {
    let r = b.r;
    let nodes_at = Loc::root().key("nodes");
    let list = r.arr(nodes_v, &nodes_at, "an array of nodes")?;
    if list.is_empty() {
        return Err(r.err(
            &nodes_at,
            ModelError::Empty {
                what: "`nodes`",
                expected: "at least one node",
            },
        ));
    }

    // Pass 1: names, ops and arity.
    let mut nodes: Vec<JsonNode<'_>> = Vec::with_capacity(list.len());
    let mut raw_inputs: Vec<&Vec<Value>> = Vec::with_capacity(list.len());
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, v) in list.iter().enumerate() {
        let at = nodes_at.index(i);
        let m = r.obj(v, &at, "a node {\"name\", \"op\", \"inputs\"}")?;
        r.keys(m, &at, &["name", "op", "inputs"])?;
        let name = r.name(
            r.required(m, &at, "name", "the node's name")?,
            &at.key("name"),
        )?;
        let op_v = r.required(m, &at, "op", "the node's op")?;
        let op_s = r.str(op_v, &at.key("op"), "an op name (a string)")?;
        let op = parse_op(op_s).ok_or_else(|| {
            r.err(
                &at.key("op"),
                ModelError::UnknownOp {
                    op: op_s.to_string(),
                    hint: closest(op_s, op_names(NODE_OPS)),
                    known: NODE_OPS.into(),
                },
            )
        })?;
        let ins_v = r.required(m, &at, "inputs", "the list of the node's input names")?;
        let ins = r.arr(ins_v, &at.key("inputs"), "an array of input names")?;
        if ins.len() != op.arity() {
            return Err(r.err(
                &at.key("inputs"),
                ModelError::Arity {
                    node: name.to_string(),
                    op: op.mnemonic(),
                    expected: op.arity(),
                    actual: ins.len(),
                },
            ));
        }
        b.define(name, Def::Node(at.clone()), &at.key("name"))?;
        index.insert(name, i);
        raw_inputs.push(ins);
        nodes.push(JsonNode {
            name,
            op,
            deps: Vec::new(),
            at,
        });
    }

    // Pass 2: resolve every input name over the whole list.
    for i in 0..nodes.len() {
        for (j, v) in raw_inputs[i].iter().enumerate() {
            let at = nodes[i].at.key("inputs").index(j);
            let s = r.str(v, &at, "an input name (a string)")?;
            let dep = if let Some(&k) = index.get(s) {
                Dep::Node(k)
            } else if let Some(&id) = b.inputs.get(s) {
                Dep::Input(id)
            } else if b.weights.as_ref().is_some_and(|w| w.contains(s)) {
                Dep::Weight(s.to_string())
            } else {
                return Err(r.err(
                    &at,
                    ModelError::Undefined {
                        name: s.to_string(),
                        user: format!("node `{}`", nodes[i].name),
                        hint: closest(s, b.known_names().iter().map(String::as_str)),
                        weights: b.weights_desc(),
                    },
                ));
            };
            nodes[i].deps.push(dep);
        }
    }

    // Pass 3: a topological order, source order among ready nodes.
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut pending: Vec<usize> = vec![0; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for d in &n.deps {
            if let Dep::Node(k) = d {
                users[*k].push(i);
                pending[i] += 1;
            }
        }
    }
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() < nodes.len() {
        let cycle = find_cycle(&nodes, &pending);
        let first = cycle.first().copied().unwrap_or(0);
        let mut names: Vec<String> = cycle.iter().map(|&i| nodes[i].name.to_string()).collect();
        names.push(nodes[first].name.to_string());
        return Err(r.err(&nodes[first].at, ModelError::Cycle { nodes: names }));
    }

    // Pass 4: build.
    let mut built: Vec<Option<NodeId>> = vec![None; nodes.len()];
    for i in order {
        let n = &nodes[i];
        let mut operands = Vec::with_capacity(n.deps.len());
        for (j, d) in n.deps.iter().enumerate() {
            let id = match d {
                Dep::Node(k) => built[*k],
                Dep::Input(id) => Some(*id),
                Dep::Weight(w) => b.weight(w, &n.at.key("inputs").index(j))?,
            };
            // Every dependency is built before its users and every weight name was checked.
            let Some(id) = id else {
                return Err(r.err(
                    &n.at.key("inputs").index(j),
                    ModelError::Conflict {
                        message: "internal error: an operand was not built before its user".into(),
                    },
                ));
            };
            operands.push(id);
        }
        built[i] = Some(b.add(n.name, n.op.clone(), &operands, &n.at)?);
    }

    // Outputs.
    let out_at = Loc::root().key("outputs");
    let outs = r.arr(outputs_v, &out_at, "an array of node names")?;
    if outs.is_empty() {
        return Err(r.err(
            &out_at,
            ModelError::Empty {
                what: "`outputs`",
                expected: "at least one node name",
            },
        ));
    }
    let mut seen = BTreeSet::new();
    for (j, v) in outs.iter().enumerate() {
        let at = out_at.index(j);
        let s = r.str(v, &at, "a node name (a string)")?;
        let what = if let Some(id) = index.get(s).and_then(|&k| built[k]) {
            if !seen.insert(s) {
                return Err(r.err(
                    &at,
                    ModelError::DuplicateOutput {
                        name: s.to_string(),
                    },
                ));
            }
            b.g.add_output(s, id);
            continue;
        } else if b.inputs.contains_key(s) {
            "a model input"
        } else if b.weights.as_ref().is_some_and(|w| w.contains(s)) {
            "a weight"
        } else {
            return Err(r.err(
                &at,
                ModelError::UnknownOutput {
                    name: s.to_string(),
                    hint: closest(s, index.keys().copied()),
                },
            ));
        };
        return Err(r.err(
            &at,
            ModelError::OutputNotNode {
                name: s.to_string(),
                what,
            },
        ));
    }
    Ok(())
}

/// The nodes of one cycle among the unbuilt ones (`pending > 0`), starting at the lowest index.
fn find_cycle(nodes: &[JsonNode<'_>], pending: &[usize]) -> Vec<usize> {
    let Some(start) = (0..nodes.len()).find(|&i| pending[i] > 0) else {
        return Vec::new();
    };
    // Every unbuilt node waits on an unbuilt node, so following such edges must revisit one.
    let mut path = vec![start];
    let mut cur = start;
    loop {
        let next = nodes[cur].deps.iter().find_map(|d| match d {
            Dep::Node(k) if pending[*k] > 0 => Some(*k),
            _ => None,
        });
        let Some(next) = next else { return path };
        if let Some(pos) = path.iter().position(|&p| p == next) {
            let mut cycle = path.split_off(pos);
            // Start at the lowest index, so the message does not depend on where the walk began.
            let min_pos = cycle
                .iter()
                .enumerate()
                .min_by_key(|&(_, &n)| n)
                .map_or(0, |(i, _)| i);
            cycle.rotate_left(min_pos);
            // The walk follows operands (user -> operand); print the data flow direction.
            cycle.reverse();
            cycle.rotate_right(1);
            return cycle;
        }
        path.push(next);
        cur = next;
    }
}

fn layers_form(b: &mut Builder<'_>, layers_v: &Value, inputs: &[NodeId]) -> R<()> {
    let r = b.r;
    let &[x] = inputs else {
        return Err(r.err(
            &Loc::root().key("inputs"),
            ModelError::LayersInputs {
                count: inputs.len(),
            },
        ));
    };
    let layers_at = Loc::root().key("layers");
    let layers = r.arr(layers_v, &layers_at, "an array of layers")?;
    if layers.is_empty() {
        return Err(r.err(
            &layers_at,
            ModelError::Empty {
                what: "`layers`",
                expected: "at least one layer",
            },
        ));
    }
    let mut cur = x;
    let (mut linears, mut acts) = (0usize, 0usize);
    for (i, v) in layers.iter().enumerate() {
        let at = layers_at.index(i);
        let m = r.obj(v, &at, "a layer {\"op\": ...}")?;
        let op_v = r.required(m, &at, "op", "the layer's op")?;
        let op = r.str(op_v, &at.key("op"), "an op name (a string)")?;
        if op == "linear" {
            linears += 1;
            cur = linear(b, m, &at, cur, linears)?;
        } else if let Some(a) = Activation::parse(op) {
            acts += 1;
            r.keys(m, &at, &["op", "name"])?;
            let (name, name_at) = match m.get("name") {
                Some(v) => (r.name(v, &at.key("name"))?.to_string(), at.key("name")),
                None => (format!("act{acts}"), at.clone()),
            };
            b.define(&name, Def::Layer(at.clone()), &name_at)?;
            cur = b.add(&name, Op::Act(a), &[cur], &at)?;
        } else {
            return Err(r.err(
                &at.key("op"),
                ModelError::UnknownOp {
                    op: op.to_string(),
                    hint: closest(op, op_names(LAYER_OPS)),
                    known: LAYER_OPS.into(),
                },
            ));
        }
    }
    b.g.add_output("y", cur);
    Ok(())
}

/// Lowers `y = x @ W^T + b` to `transpose`, `matmul` and (with a bias) `add`.
fn linear(b: &mut Builder<'_>, m: &Map<String, Value>, at: &Loc, x: NodeId, k: usize) -> R<NodeId> {
    let r = b.r;
    let (name, name_at) = match m.get("name") {
        Some(v) => (r.name(v, &at.key("name"))?.to_string(), at.key("name")),
        None => (format!("fc{k}"), at.clone()),
    };
    let (w_name, w, bias, w_at) = if let Some(wv) = m.get("weight") {
        r.keys(m, at, &["op", "name", "weight", "bias"])?;
        let w_at = at.key("weight");
        let w_name = r.name(wv, &w_at)?.to_string();
        let w = b
            .weight(&w_name, &w_at)?
            .ok_or_else(|| missing_weight(b, &w_name, &w_at))?;
        let ty = &b.g.node(w).ty;
        if ty.rank() != 2 {
            return Err(r.err(
                &w_at,
                ModelError::WeightShape {
                    name: w_name,
                    expected: "a matrix [out, in]".into(),
                    actual: shape_text(&ty.shape),
                },
            ));
        }
        let bias = match m.get("bias") {
            None => None,
            Some(bv) => {
                let b_at = at.key("bias");
                let b_name = r.str(bv, &b_at, "the name of the bias tensor (a string)")?;
                let id = b
                    .weight(b_name, &b_at)?
                    .ok_or_else(|| missing_weight(b, b_name, &b_at))?;
                let (b_ty, out) = (&b.g.node(id).ty, &b.g.node(w).ty.shape[0]);
                if b_ty.shape.as_slice() != std::slice::from_ref(out) {
                    return Err(r.err(
                        &b_at,
                        ModelError::WeightShape {
                            name: b_name.to_string(),
                            expected: format!(
                                "a vector [{out}], one value per output feature of `{w_name}`"
                            ),
                            actual: shape_text(&b_ty.shape),
                        },
                    ));
                }
                Some((id, b_at))
            }
        };
        (w_name, w, bias, w_at)
    } else {
        if let Some(Weights::File { shown, .. }) = &b.weights {
            return Err(r.err(
                at,
                ModelError::Conflict {
                    message: format!(
                        "a linear without \"weight\" generates its weights from \"seed\", but \
                         this model loads its weights from `{shown}`: name the tensors with \
                         \"weight\" (and \"bias\")"
                    ),
                },
            ));
        }
        r.keys(m, at, &["op", "name", "in", "out", "bias"])?;
        let out_v = r.required(m, at, "out", "the number of output features")?;
        let out = r.dim(out_v, &at.key("out"), false)?.fixed().unwrap_or(1);
        let x_ty = b.g.node(x).ty.clone();
        let last = x_ty.shape.last().and_then(Dim::fixed);
        let fan_in = match (m.get("in"), last) {
            (Some(v), _) => {
                let declared = r.dim(v, &at.key("in"), false)?.fixed().unwrap_or(1);
                if last != Some(declared) {
                    return Err(r.err(
                        &at.key("in"),
                        ModelError::LayerIn {
                            layer: name,
                            declared,
                            actual: shape_text(&x_ty.shape),
                        },
                    ));
                }
                declared
            }
            (None, Some(n)) => n,
            (None, None) => {
                return Err(r.err(
                    at,
                    ModelError::Conflict {
                        message: format!(
                            "layer `{name}` cannot take its in-features from its input of shape \
                             {}: the last dimension must be fixed",
                            shape_text(&x_ty.shape)
                        ),
                    },
                ))
            }
        };
        let has_bias = match m.get("bias") {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                r.ty(&at.key("bias"), "true or false (generate a bias or not)", v)
            })?,
        };
        let bound = 1.0 / (fan_in as f64).sqrt();
        let w_name = format!("{name}.weight");
        b.define(&w_name, Def::Layer(at.clone()), at)?;
        let data = b.generate(&w_name, &[out, fan_in], bound, at)?;
        let w = b.add_weight(&w_name, data, at)?;
        let bias = if has_bias {
            let b_name = format!("{name}.bias");
            b.define(&b_name, Def::Layer(at.clone()), at)?;
            let data = b.generate(&b_name, &[out], bound, at)?;
            Some((b.add_weight(&b_name, data, at)?, at.key("bias")))
        } else {
            None
        };
        (w_name, w, bias, at.clone())
    };

    let wt = match b.transposes.get(&w_name) {
        Some(&t) => t,
        None => {
            let t_name = format!("{w_name}.t");
            b.define(&t_name, Def::Layer(at.clone()), at)?;
            let t = b.add(&t_name, Op::Transpose, &[w], &w_at)?;
            b.transposes.insert(w_name, t);
            t
        }
    };
    match bias {
        None => {
            b.define(&name, Def::Layer(at.clone()), &name_at)?;
            b.add(&name, Op::MatMul, &[x, wt], &w_at)
        }
        Some((bias, b_at)) => {
            let mm_name = format!("{name}.matmul");
            b.define(&mm_name, Def::Layer(at.clone()), at)?;
            b.define(&name, Def::Layer(at.clone()), &name_at)?;
            let mm = b.add(&mm_name, Op::MatMul, &[x, wt], &w_at)?;
            b.add(&name, Op::Add, &[mm, bias], &b_at)
        }
    }
}

fn missing_weight(b: &Builder<'_>, name: &str, at: &Loc) -> FrontendError {
    let (source_desc, hint) = match &b.weights {
        Some(Weights::File { shown, names, .. }) => (
            format!("a tensor of `{shown}`"),
            closest(name, names.iter().map(String::as_str)),
        ),
        Some(Weights::Params(p)) => (
            "declared in `params`".to_string(),
            closest(name, p.keys().map(String::as_str)),
        ),
        None => (
            "available: the model has no `weights` file or `params`".to_string(),
            Hint(None),
        ),
    };
    b.r.err(
        at,
        ModelError::MissingWeight {
            name: name.to_string(),
            source_desc,
            hint,
        },
    )
}

fn is_glob(key: &str) -> bool {
    key.contains(['*', '?', '[', '{'])
}

fn sparsity(b: &Builder<'_>, v: &Value, at: &Loc) -> R<Vec<SparsitySpec>> {
    let r = b.r;
    let m = r.obj(
        v,
        at,
        "an object mapping weight names or globs to {\"block\": [rows, cols], \"density\": d}",
    )?;
    let weights: Vec<&str> = b.g.weights().keys().map(String::as_str).collect();
    let weight_list = || {
        if weights.is_empty() {
            "none".to_string()
        } else {
            let v: Vec<String> = weights.iter().map(|w| format!("`{w}`")).collect();
            v.join(", ")
        }
    };
    let mut chosen: BTreeMap<String, SparsitySpec> = BTreeMap::new();
    // The weights selected as another's `"with"`, not by their own key.
    let mut partners: BTreeSet<String> = BTreeSet::new();
    for (key, spec) in m {
        let kat = at.key(key);
        let sm = r.obj(
            spec,
            &kat,
            "a sparsity spec {\"block\": [rows, cols], \"density\": d}",
        )?;
        r.keys(sm, &kat, &["block", "density", "with"])?;
        let block_at = kat.key("block");
        let block_v = r.required(sm, &kat, "block", "[rows, cols] of a block")?;
        let dims = r.fixed_shape(block_v, &block_at)?;
        let &[rows, cols] = dims.as_slice() else {
            return Err(r.ty(&block_at, "[rows, cols]: two positive integers", block_v));
        };
        let density = match sm.get("density") {
            None => None,
            Some(dv) => {
                let at = kat.key("density");
                let d = dv.as_f64().filter(|d| *d > 0.0 && *d <= 1.0);
                Some(d.ok_or_else(|| {
                    // A number too small for a 64-bit float parses as 0: say what was written.
                    let nonzero = |t: &str| {
                        let mantissa = t.split(['e', 'E']).next().unwrap_or(t);
                        mantissa.bytes().any(|b| matches!(b, b'1'..=b'9'))
                    };
                    let found = match at.text(r.src) {
                        Some(t) if dv.as_f64() == Some(0.0) && nonzero(t) => {
                            format!("the number {t}, which is 0 as a 64-bit float")
                        }
                        _ => describe(dv),
                    };
                    r.err(&at, ModelError::Density { found })
                })?)
            }
        };
        let with_err = |message: String| {
            r.err(
                &kat.key("with"),
                ModelError::SparsityWith {
                    key: key.clone(),
                    message,
                },
            )
        };
        let with = match sm.get("with") {
            None => None,
            Some(wv) => {
                let Some(text) = wv.as_str() else {
                    return Err(r.ty(
                        &kat.key("with"),
                        "a weight name (or, for a glob key, a glob with as many `*`)",
                        wv,
                    ));
                };
                if density.is_none() {
                    return Err(with_err(
                        "needs a \"density\": weights pruned together keep the blocks of largest \
                         summed norm"
                            .to_string(),
                    ));
                }
                Some(text)
            }
        };
        // A key that is a weight's name selects that weight, also where it reads as a glob.
        let plain_key = weights.contains(&key.as_str()) || !is_glob(key);
        if let Some(text) = with {
            let stars = |t: &str| t.matches('*').count();
            if plain_key && is_glob(text) {
                return Err(with_err(format!(
                    "`{text}` is a glob, but the key names one weight: name one weight"
                )));
            }
            if !plain_key
                && (key.contains(['?', '[', '{'])
                    || text.contains(['?', '[', '{'])
                    || stars(key) != stars(text))
            {
                return Err(with_err(format!(
                    "`{text}` must have as many `*` as the key and no other wildcard (each `*` \
                     takes the text the key's `*` matched), and the key no wildcard but `*`"
                )));
            }
        }
        let matched: Vec<&str> = if weights.contains(&key.as_str()) {
            vec![key.as_str()]
        } else if is_glob(key) {
            let glob = globset::Glob::new(key).map_err(|e| {
                r.err(
                    &kat,
                    ModelError::Glob {
                        pattern: key.clone(),
                        message: e.kind().to_string(),
                    },
                )
            })?;
            let matcher = glob.compile_matcher();
            let matched: Vec<&str> = weights
                .iter()
                .copied()
                .filter(|w| matcher.is_match(w))
                .collect();
            if matched.is_empty() {
                return Err(r.err(
                    &kat,
                    ModelError::SparsityNoMatch {
                        pattern: key.clone(),
                        weights: weight_list(),
                    },
                ));
            }
            matched
        } else {
            let what = match b.defs.get(key.as_str()) {
                Some(Def::Input(_)) => "the model input".to_string(),
                Some(Def::Node(_) | Def::Layer(_)) => "a computed node".to_string(),
                Some(Def::Param(_)) => "a parameter that no node uses".to_string(),
                None if b.weights.as_ref().is_some_and(|w| w.contains(key)) => {
                    "a tensor of the weights file that no node uses".to_string()
                }
                None => "nothing".to_string(),
            };
            return Err(r.err(
                &kat,
                ModelError::SparsityNotWeight {
                    key: key.clone(),
                    what,
                    hint: closest(key, weights.iter().copied()),
                },
            ));
        };
        for w in matched {
            let shape =
                b.g.weight(w)
                    .map(|t| t.shape().to_vec())
                    .unwrap_or_default();
            let &[out, inn] = shape.as_slice() else {
                return Err(r.err(
                    &kat,
                    ModelError::SparsityRank {
                        weight: w.to_string(),
                        shape,
                    },
                ));
            };
            if !(out as u64).is_multiple_of(rows) || !(inn as u64).is_multiple_of(cols) {
                return Err(r.err(
                    &block_at,
                    ModelError::SparsityBlock {
                        weight: w.to_string(),
                        block: [rows, cols],
                        shape,
                    },
                ));
            }
            let partner = match with {
                None => None,
                Some(text) if plain_key => Some(text.to_string()),
                Some(text) => {
                    // Matched by globset, so the `*`-only key splits the name this way.
                    let caps = star_captures(key, w).unwrap_or_default();
                    let mut caps = caps.into_iter();
                    let mut p = String::new();
                    for (k, lit) in text.split('*').enumerate() {
                        if k > 0 {
                            p.push_str(caps.next().unwrap_or_default());
                        }
                        p.push_str(lit);
                    }
                    Some(p)
                }
            };
            if let Some(p) = &partner {
                let pshape = b.g.weight(p).map(|t| t.shape().to_vec());
                let message = match pshape {
                    _ if p == w => Some(format!("names `{w}` itself")),
                    None => Some(format!(
                        "names `{p}` for `{w}`, which is not a weight of the model{}",
                        closest(p, weights.iter().copied().filter(|x| *x != w))
                    )),
                    Some(s) if s != shape => Some(format!(
                        "names `{p}` of shape {s:?} for `{w}` of shape {shape:?}: weights \
                         pruned together have one shape"
                    )),
                    Some(_) => None,
                };
                if let Some(message) = message {
                    return Err(with_err(message));
                }
            }
            for name in std::iter::once(w).chain(partner.as_deref()) {
                if let Some(prev) = chosen.get(name) {
                    if prev.pattern == *key {
                        return Err(with_err(format!(
                            "makes `{name}` the partner of two weights, or of one the key \
                             selects too; each weight is pruned with at most one other"
                        )));
                    }
                    let by = match partners.contains(name) {
                        true => " (its \"with\")",
                        false => "",
                    };
                    return Err(r.err(
                        &kat,
                        ModelError::SparsityOverlap {
                            weight: name.to_string(),
                            first: format!("`{}`{by}", prev.pattern),
                            second: key.clone(),
                        },
                    ));
                }
            }
            chosen.insert(
                w.to_string(),
                SparsitySpec {
                    weight: w.to_string(),
                    pattern: key.clone(),
                    block: [rows, cols],
                    density,
                    with: partner.clone(),
                },
            );
            if let Some(p) = partner {
                partners.insert(p.clone());
                chosen.insert(
                    p.clone(),
                    SparsitySpec {
                        weight: p,
                        pattern: key.clone(),
                        block: [rows, cols],
                        density,
                        with: Some(w.to_string()),
                    },
                );
            }
        }
    }
    Ok(chosen.into_values().collect())
}

/// The texts the `*`s of `key` (a glob whose only wildcard is `*`) match in `name`, each middle
/// one as short as it can be; `None` where `name` does not match.
fn star_captures<'a>(key: &str, name: &'a str) -> Option<Vec<&'a str>> {
    let mut parts = key.split('*');
    let mut rest = name.strip_prefix(parts.next()?)?;
    let literals: Vec<&str> = parts.collect();
    let mut caps = Vec::with_capacity(literals.len());
    for (k, lit) in literals.iter().enumerate() {
        if k + 1 == literals.len() {
            caps.push(rest.strip_suffix(lit)?);
        } else {
            let at = rest.find(lit)?;
            caps.push(&rest[..at]);
            rest = &rest[at + lit.len()..];
        }
    }
    Some(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_captures_split_a_name_by_the_keys_stars() {
        let caps = |k, n| star_captures(k, n);
        assert_eq!(
            caps(
                "layers.*.mlp.gate_proj.weight",
                "layers.12.mlp.gate_proj.weight"
            ),
            Some(vec!["12"])
        );
        assert_eq!(
            caps("*.gate.*", "a.gate.b.gate.c"),
            Some(vec!["a", "b.gate.c"])
        );
        assert_eq!(caps("*ab*b", "abb"), Some(vec!["", ""]));
        assert_eq!(caps("plain", "plain"), Some(vec![]));
        assert_eq!(caps("a*", "b"), None);
        assert_eq!(caps("*x", "xy"), None);
    }

    #[test]
    fn edit_distance_and_hints() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(edit_distance("gleu", "gelu"), 1);
        assert_eq!(closest("z", ["h"]), Hint(None));
        assert_eq!(
            closest("ouputs", TOP_KEYS.iter().copied()),
            Hint(Some("outputs".into()))
        );
        assert_eq!(closest("zzzzzz", TOP_KEYS.iter().copied()), Hint(None));
        // Long names get no hint (the distance table would grow with the product of lengths),
        // and candidates of a length too far off are not measured.
        let long = "a".repeat(257);
        assert_eq!(
            closest(&long, [long[1..].to_string()].iter().map(String::as_str)),
            Hint(None)
        );
        let fits = "a".repeat(256);
        assert_eq!(
            closest(&fits, [fits[1..].to_string()].iter().map(String::as_str)),
            Hint(Some(fits[1..].to_string()))
        );
    }
}
