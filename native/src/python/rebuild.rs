//! `streamd._native.ModelPlan`: a pydantic model rebuilt from the dict it was
//! dumped to, the way `streamd/adk/convert.py`'s `_Plan.build` builds it.
//!
//! Python stays the definition: it reads pydantic's metadata, compiles each
//! class's plan, and hands this module the result once per class (the
//! fields' rules, the template, the default factories, the required names,
//! the after-validators). This module only runs the plan, object by object,
//! so that the per-event work (a few dicts, five or so models) costs no
//! interpreted bytecode. Whatever the plan does not know for certain comes
//! back as `None` ("not built"), and the Python code decides as it always
//! did; `tests/adk/test_convert.py` holds both paths to equal models.
//!
//! Every call made here on Python objects (`__new__`, factories,
//! `model_post_init`, validators, a nested model's Python fallback) is made
//! in the order the Python plan makes it, so side effects and exceptions are
//! the same. The work cannot release the GIL: it is all Python objects.

use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyInt, PyList, PySet, PyString, PyTuple, PyType};

use super::guarded;

/// How a JSON value becomes a field's value: the Python plan's rule kinds
/// (`convert.py`), each with what it needs.
enum Spec {
    /// Kept as it is.
    Same,
    /// Kept if it is exactly of this type.
    Type(Py<PyType>),
    /// Never converted for certain: validation decides.
    Never,
    /// An enum member by value (str or int only).
    Enum(Py<PyDict>),
    /// A nested model.
    Model(Box<Nested>),
    /// A JSON array as a list, items by the rule (None allowed if nullable).
    List(Box<Spec>, bool),
    /// The same, made a set.
    Set(Box<Spec>, bool),
    /// A JSON object (str keys), values by the rule.
    Dict(Box<Spec>, bool),
    /// Converted by the rule, then passed through these after-validators.
    Then(Box<Spec>, Vec<PyObject>),
}

/// A nested model: its own plan, found at first use (plans nest, even
/// themselves, so it cannot be asked for while the parent's is made), and
/// what decides when that plan cannot build it: the value validated alone,
/// as the parent's validation would (the Python plan's `_model` does the
/// same after its own plan refuses).
struct Nested {
    resolve: PyObject,
    plan: GILOnceCell<Option<Py<ModelPlan>>>,
    fallback: PyObject,
    /// What `fallback` returns for "cannot".
    no: PyObject,
}

/// How many models deep a build goes before it hands the data back (the
/// Python path decides, and validation's own limits apply): the builder
/// recurses on the native stack, which, unlike the interpreter's, has no
/// recursion check, and data nested this deep is no event the service wrote.
const MAX_NESTING: usize = 64;

/// One field's rule: its conversion and whether None is kept.
struct Field {
    spec: Spec,
    nullable: bool,
}

/// One model class's compiled plan.
#[pyclass(module = "streamd._native", frozen)]
pub struct ModelPlan {
    cls: Py<PyType>,
    new: PyObject,
    /// Every field, in the fields' order, with its default (None where a
    /// factory or the data fills it).
    template: Py<PyDict>,
    /// Field name -> index into `fields`.
    index: Py<PyDict>,
    fields: Vec<Field>,
    factories: Vec<(Py<PyString>, PyObject)>,
    required: Vec<Py<PyString>>,
    after: Vec<PyObject>,
    /// The class's `model_post_init`, where the plan calls it (as
    /// `model.model_post_init(None)`: the class's function, the model first).
    post_init: Option<PyObject>,
}

fn spec_of(obj: &Bound<'_, PyAny>, no: &PyObject) -> PyResult<Spec> {
    let t = obj.downcast::<PyTuple>()?;
    let tag: String = t.get_item(0)?.extract()?;
    let nullable = || -> PyResult<bool> { t.get_item(2)?.extract() };
    let item = || -> PyResult<Box<Spec>> { Ok(Box::new(spec_of(&t.get_item(1)?, no)?)) };
    Ok(match tag.as_str() {
        "same" => Spec::Same,
        "never" => Spec::Never,
        "type" => Spec::Type(t.get_item(1)?.downcast::<PyType>()?.clone().unbind()),
        "enum" => Spec::Enum(t.get_item(1)?.downcast::<PyDict>()?.clone().unbind()),
        "model" => Spec::Model(Box::new(Nested {
            resolve: t.get_item(1)?.unbind(),
            plan: GILOnceCell::new(),
            fallback: t.get_item(2)?.unbind(),
            no: no.clone_ref(obj.py()),
        })),
        "list" => Spec::List(item()?, nullable()?),
        "set" => Spec::Set(item()?, nullable()?),
        "dict" => Spec::Dict(item()?, nullable()?),
        "then" => Spec::Then(item()?, t.get_item(2)?.extract()?),
        other => return Err(PyValueError::new_err(format!("ModelPlan: no rule kind {other:?}"))),
    })
}

/// `object.__setattr__(obj, name, value)`: pydantic's own `__setattr__`
/// validates, and going through `object.__setattr__` from here is a Python
/// call per attribute (four per model), a tenth of a model's building.
fn set_slot(obj: &Bound<'_, PyAny>, name: &Bound<'_, PyString>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    // SAFETY: three live, owned references, held across the call; the
    // function is CPython's generic attribute setter (what object.__setattr__
    // runs), which returns -1 with an exception set on failure.
    let rc = unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if rc < 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(())
}

/// A value as the rule converts it; None: it cannot (validation decides).
fn convert<'py>(spec: &Spec, value: &Bound<'py, PyAny>, depth: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = value.py();
    Ok(match spec {
        Spec::Same => Some(value.clone()),
        Spec::Type(t) => value.get_type().is(t).then(|| value.clone()),
        Spec::Never => None,
        Spec::Enum(members) => {
            if !(value.is_exact_instance_of::<PyString>() || value.is_exact_instance_of::<PyInt>()) {
                return Ok(None);
            }
            members.bind(py).get_item(value)?
        }
        Spec::Model(nested) => {
            let plan = nested.plan.get_or_try_init(py, || -> PyResult<_> {
                let got = nested.resolve.bind(py).call0()?;
                Ok(if got.is_none() { None } else { Some(got.downcast::<ModelPlan>()?.clone().unbind()) })
            })?;
            if let Some(plan) = plan {
                if let Some(built) = plan.get().build_in(value, depth + 1)? {
                    return Ok(Some(built));
                }
            }
            // Validated alone; `no` if that failed (the parent is validated then).
            let got = nested.fallback.bind(py).call1((value,))?;
            (!got.is(&nested.no)).then_some(got)
        }
        Spec::List(item, nullable) => {
            if !value.is_exact_instance_of::<PyList>() {
                return Ok(None);
            }
            items(item, *nullable, value.downcast::<PyList>()?.iter(), depth)?
                .map(|out| PyList::new(py, out))
                .transpose()?
                .map(Bound::into_any)
        }
        Spec::Set(item, nullable) => {
            if !value.is_exact_instance_of::<PyList>() {
                return Ok(None);
            }
            items(item, *nullable, value.downcast::<PyList>()?.iter(), depth)?
                .map(|out| PySet::new(py, out))
                .transpose()?
                .map(Bound::into_any)
        }
        Spec::Dict(item, nullable) => {
            if !value.is_exact_instance_of::<PyDict>() {
                return Ok(None);
            }
            let d = value.downcast::<PyDict>()?;
            let Some(out) = items(item, *nullable, d.values().iter(), depth)? else {
                return Ok(None);
            };
            let made = PyDict::new(py);
            for (k, v) in d.keys().iter().zip(out) {
                made.set_item(k, v)?;
            }
            Some(made.into_any())
        }
        Spec::Then(inner, checks) => {
            let Some(mut v) = convert(inner, value, depth)? else {
                return Ok(None);
            };
            for check in checks {
                match check.bind(py).call1((v,)) {
                    Ok(checked) => v = checked,
                    Err(e) if refusal(py, &e) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
            Some(v)
        }
    })
}

/// What an after-validator raises to refuse a value (`convert.py`'s
/// `_REFUSALS`): validation reports it, as the model's own error.
fn refusal(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<PyValueError>(py) || e.is_instance_of::<PyAssertionError>(py)
}

fn items<'py>(
    item: &Spec,
    nullable: bool,
    values: impl Iterator<Item = Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
    let mut out = Vec::with_capacity(values.size_hint().0);
    for v in values {
        if v.is_none() {
            if !nullable {
                return Ok(None);
            }
            out.push(v);
        } else {
            match convert(item, &v, depth)? {
                Some(c) => out.push(c),
                None => return Ok(None),
            }
        }
    }
    Ok(Some(out))
}

/// `set`, left off the cyclic garbage collector's lists. A model's fields set
/// holds field names (strings) only, so it can be part of no cycle, but
/// CPython keeps every set tracked whatever it holds (it untracks dicts and
/// tuples of atomic values itself): a cold load makes five such sets an
/// event, a third of the objects the collection after it would walk (measured:
/// that young collection 3.0 -> 1.8 ms for 2,000 events).
fn untracked<'py>(set: Bound<'py, PySet>) -> Bound<'py, PySet> {
    // SAFETY: `set` is a live set object we hold a reference to, with the GIL
    // held; PyObject_GC_UnTrack is a no-op on an object not tracked.
    unsafe { ffi::PyObject_GC_UnTrack(set.as_ptr().cast()) };
    set
}

impl ModelPlan {
    /// `_Plan.build`: the model, or None where the Python path decides.
    fn build_in<'py>(&self, data: &Bound<'py, PyAny>, depth: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = data.py();
        if depth > MAX_NESTING {
            return Ok(None);
        }
        let Ok(data) = data.downcast_exact::<PyDict>() else {
            return Ok(None);
        };
        let index = self.index.bind(py);
        let full = self.template.bind(py).copy()?; // in the fields' order, as validation makes it
        let given = PySet::empty(py)?;
        for (key, value) in data.iter() {
            let Some(i) = index.get_item(&key)? else {
                return Ok(None); // not a field (by this name): validation decides
            };
            let field = &self.fields[i.extract::<usize>()?];
            let value = if value.is_none() {
                if !field.nullable {
                    return Ok(None);
                }
                value
            } else {
                match convert(&field.spec, &value, depth)? {
                    Some(v) => v,
                    None => return Ok(None),
                }
            };
            given.add(&key)?;
            full.set_item(key, value)?;
        }
        for name in &self.required {
            if !data.contains(name.bind(py))? {
                return Ok(None);
            }
        }
        for (name, factory) in &self.factories {
            let name = name.bind(py);
            if !data.contains(name)? {
                full.set_item(name, factory.bind(py).call0()?)?;
            }
        }
        let cls = self.cls.bind(py);
        let mut model = self.new.bind(py).call1((cls,))?;
        set_slot(&model, intern!(py, "__dict__"), &full)?;
        set_slot(&model, intern!(py, "__pydantic_fields_set__"), &untracked(given))?;
        set_slot(&model, intern!(py, "__pydantic_extra__"), &py.None().into_bound(py))?;
        set_slot(&model, intern!(py, "__pydantic_private__"), &py.None().into_bound(py))?;
        if let Some(post_init) = &self.post_init {
            post_init.bind(py).call1((&model, py.None()))?;
        }
        for check in &self.after {
            match check.bind(py).call1((model,)) {
                Ok(checked) => model = checked,
                Err(e) if refusal(py, &e) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(model))
    }
}

#[pymethods]
impl ModelPlan {
    /// `fields`: `(name, rule, nullable)` in the fields' order, each rule a
    /// tuple naming its kind (see `convert.py`'s `_spec`); `factories`:
    /// `(name, factory)`; `no`: the Python plan's sentinel.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        cls: &Bound<'_, PyType>,
        template: &Bound<'_, PyDict>,
        fields: Vec<(Bound<'_, PyString>, Bound<'_, PyAny>, bool)>,
        factories: Vec<(Bound<'_, PyString>, PyObject)>,
        required: Vec<Bound<'_, PyString>>,
        after: Vec<PyObject>,
        post_init: bool,
        no: PyObject,
    ) -> PyResult<Self> {
        let py = cls.py();
        let index = PyDict::new(py);
        let mut rules = Vec::with_capacity(fields.len());
        for (i, (name, spec, nullable)) in fields.iter().enumerate() {
            index.set_item(name, i)?;
            rules.push(Field { spec: spec_of(spec, &no)?, nullable: *nullable });
        }
        Ok(ModelPlan {
            cls: cls.clone().unbind(),
            new: cls.getattr(intern!(py, "__new__"))?.unbind(),
            template: template.copy()?.unbind(),
            index: index.unbind(),
            fields: rules,
            factories: factories.into_iter().map(|(n, f)| (n.unbind(), f)).collect(),
            required: required.into_iter().map(Bound::unbind).collect(),
            after,
            post_init: if post_init {
                Some(cls.getattr(intern!(py, "model_post_init"))?.unbind())
            } else {
                None
            },
        })
    }

    /// The model built from `data`, or None where the Python path must decide.
    fn build<'py>(&self, data: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        guarded("ModelPlan.build", || self.build_in(data, 0))?
    }

    /// `build` of each, None where the Python path must decide.
    fn build_all<'py>(&self, datas: &Bound<'py, PyList>) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
        guarded("ModelPlan.build_all", || datas.iter().map(|d| self.build_in(&d, 0)).collect())?
    }
}

/// Adds `ModelPlan`, `copy_models` and `REBUILD_INTERFACE` (bumped whenever `ModelPlan`'s
/// arguments or results change: `streamd/adk/convert.py` takes the Python
/// path with a module built from older sources). Kept apart from the
/// indexing core's `INTERFACE`, which says nothing about this class.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("REBUILD_INTERFACE", 1)?;
    m.add_function(wrap_pyfunction!(copy_models, m)?)?;
    m.add_class::<ModelPlan>()
}

/// `pydantic_core.PydanticUndefined`, looked up once.
static UNDEFINED: GILOnceCell<PyObject> = GILOnceCell::new();

/// `convert.copied` of each model (pydantic's shallow `model_copy`: its own
/// `__dict__`, fields set, extra and private values, nested values shared):
/// a session load hands out a copy of every cached event, and made here a
/// copy costs no interpreted bytecode.
#[pyfunction]
pub fn copy_models<'py>(models: &Bound<'py, PyList>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = models.py();
    let undefined = UNDEFINED
        .get_or_try_init(py, || -> PyResult<_> {
            Ok(py.import("pydantic_core")?.getattr("PydanticUndefined")?.unbind())
        })?
        .bind(py);
    guarded("copy_models", || models.iter().map(|m| copy_model(&m, undefined)).collect())?
}

fn copy_model<'py>(model: &Bound<'py, PyAny>, undefined: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = model.py();
    let cls = model.get_type();
    let new = cls.getattr(intern!(py, "__new__"))?.call1((&cls,))?;
    let dict = model.getattr(intern!(py, "__dict__"))?.downcast_into::<PyDict>()?.copy()?;
    set_slot(&new, intern!(py, "__dict__"), &dict)?;
    let extra = model.getattr(intern!(py, "__pydantic_extra__"))?;
    let extra = if extra.is_none() { extra } else { extra.downcast_into::<PyDict>()?.copy()?.into_any() };
    set_slot(&new, intern!(py, "__pydantic_extra__"), &extra)?;
    let given = model.getattr(intern!(py, "__pydantic_fields_set__"))?.downcast_into::<PySet>()?;
    let copied = PySet::new(py, given.iter())?;
    // Untracked only while it holds names alone (someone may have put
    // anything in the model's set since it was built).
    let names_only = copied.iter().all(|name| name.is_exact_instance_of::<PyString>());
    let copied = if names_only { untracked(copied) } else { copied };
    set_slot(&new, intern!(py, "__pydantic_fields_set__"), copied.as_any())?;
    // getattr(model, "__pydantic_private__", None): an unset slot reads as absent.
    let private = match model.getattr(intern!(py, "__pydantic_private__")) {
        Ok(p) => p,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => py.None().into_bound(py),
        Err(e) => return Err(e),
    };
    let private = if private.is_none() {
        private
    } else {
        let kept = PyDict::new(py);
        for (k, v) in private.downcast_into::<PyDict>()?.iter() {
            if !v.is(undefined) {
                kept.set_item(k, v)?;
            }
        }
        kept.into_any()
    };
    set_slot(&new, intern!(py, "__pydantic_private__"), &private)?;
    Ok(new)
}
