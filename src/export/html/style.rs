//! The style sheet every page of the report shares (the run page, the fleet, a sweep). On a
//! narrow screen (a phone, 390 px) tables and charts scroll sideways inside the page instead
//! of widening it: a chart shrunk to fit would shrink its 11 px labels below reading size.

pub(crate) const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1240px;color:#222}\
h1{border-bottom:2px solid #1f77b4}h2{margin-top:2em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:right}\
th{background:#f3f6fa}td:first-child,th:first-child{text-align:left}.finding{background:#fff6e5;border-left:4px solid #ff7f0e;padding:.4em .8em;margin:.3em 0}\
.verdict{background:#eef6ee;border-left:4px solid #2ca02c;padding:.4em .8em;margin:.3em 0}.status{color:#a33}\
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}.host td{text-align:left}.warning{color:#a40}\
table.summary td,table.summary th{text-align:left;vertical-align:top}table.summary{font-size:.85em;width:100%}\
tr.question th{background:#e8eef6;font-weight:600}td.answer b{font-weight:600}.better{background:#eef6ee}.worse{background:#fdecea}.undecided{background:#fff6e5}\
.threads-head{margin:.8em 0 0;font-weight:600;font-size:.9em}.threads{font-size:.85em;padding-left:1.2em;margin:.3em 0}.threads li{margin:.15em 0}p.question{font-style:italic}p.verdict.worse{border-left-color:#d62728;background:#fdecea}p.verdict.undecided{border-left-color:#ff7f0e;background:#fff6e5}\
.how dt{font-weight:600;margin-top:.3em}.how dd{margin-left:1.5em}.links{margin:.6em 0}\
figure{overflow-x:auto}code{overflow-wrap:anywhere}\
@media (max-width:700px){body{margin:.5em;padding:0 .5em}h1{font-size:1.6em}table{display:block;overflow-x:auto}.how dd{margin-left:.8em}}";
