//! Which rule fired an alert, and which of its expression's series is
//! that alert: pure functions over what Prometheus serves, so each case
//! (two rules of one name, a static `severity`, `external_labels`, a
//! label a fix changes) is tested without a server.
//!
//! An alert's labels are its series' labels, plus its rule's static
//! labels (which overwrite a series label of the same name), plus the
//! server's `external_labels` and whatever `alert_relabel_configs` adds
//! (both added to the alerts it sends, never to a query's result), without
//! `__name__`. So the series is found by taking the names known to be
//! added away on both sides, and a series is the alert when every label it
//! has left is the alert's: the alert may carry more (a relabelled one),
//! never other values. That errs toward "still firing": a series with
//! fewer labels that could be this alert counts as it, and a run is never
//! called cleared while such a series is there. A label value is never
//! written into PromQL, so none can inject.

use std::collections::{BTreeMap, BTreeSet};

use crate::prometheus::{AlertRule, Sample};

/// A rule label's value that Prometheus fills in per alert: any value matches.
fn templated(value: &str) -> bool {
    value.contains("{{")
}

/// The rules that could have fired an alert with `labels`: alerting rules
/// of its `alertname` whose static labels it carries. Several rules can
/// share a name; when more than one is left, the one whose expression the
/// alert's `generatorURL` names is kept, else all of them.
pub(crate) fn rules_of<'a>(
    rules: &'a [AlertRule],
    labels: &BTreeMap<String, String>,
    generator_expr: Option<&str>,
) -> Vec<&'a AlertRule> {
    let Some(name) = labels.get("alertname") else {
        return Vec::new();
    };
    let carried: Vec<&AlertRule> = rules
        .iter()
        .filter(|r| &r.name == name)
        .filter(|r| {
            r.labels
                .iter()
                .all(|(k, v)| templated(v) || labels.get(k) == Some(v))
        })
        .collect();
    if carried.len() > 1
        && let Some(expr) = generator_expr
    {
        let named: Vec<&AlertRule> = carried
            .iter()
            .copied()
            .filter(|r| same_expr(&r.query, expr))
            .collect();
        if !named.is_empty() {
            return named;
        }
    }
    carried
}

/// Two spellings of one expression (Prometheus serves a rule's query as
/// it formats it; `generatorURL` has it as written).
fn same_expr(a: &str, b: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    squeeze(a) == squeeze(b)
}

/// `g0.expr` of an alert's `generatorURL`: the rule's expression as
/// Prometheus linked it, where the rules API has no rule to match.
pub(crate) fn generator_expr(generator_url: &str) -> Option<String> {
    let url = url::Url::parse(generator_url).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == "g0.expr")
        .map(|(_, v)| v.into_owned())
        .filter(|e| !e.trim().is_empty())
}

/// The series of one rule's expression that an alert is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// The labels its series must have, exactly, once `dropped` are taken away.
    pub(crate) labels: BTreeMap<String, String>,
    /// Names matched on neither side: `alertname`, the rule's static labels,
    /// the server's external labels, the runbook's `ignore_labels`.
    pub(crate) dropped: BTreeSet<String>,
}

impl Wanted {
    /// The series of an alert with `labels` fired by a rule with
    /// `rule_labels`, on a server with `external`, ignoring `ignore`.
    pub(crate) fn of(
        labels: &BTreeMap<String, String>,
        rule_labels: &BTreeMap<String, String>,
        external: &BTreeMap<String, String>,
        ignore: &[String],
    ) -> Wanted {
        let dropped: BTreeSet<String> = std::iter::once("alertname".to_string())
            .chain(rule_labels.keys().cloned())
            .chain(external.keys().cloned())
            .chain(ignore.iter().cloned())
            .collect();
        Wanted {
            labels: without(labels, &dropped),
            dropped,
        }
    }

    /// Whether `sample` may be this series: each of its labels, but those
    /// dropped and `__name__`, is the alert's with the same value.
    pub(crate) fn is(&self, sample: &Sample) -> bool {
        sample
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != "__name__" && !self.dropped.contains(*k))
            .all(|(k, v)| self.labels.get(k) == Some(v))
    }

    /// The series of an alert with `labels` in `ALERTS`, whose series
    /// carry the rule's static labels and `alertstate`, never the
    /// server's external labels.
    pub(crate) fn in_alerts(
        labels: &BTreeMap<String, String>,
        external: &BTreeMap<String, String>,
        ignore: &[String],
    ) -> Wanted {
        let dropped: BTreeSet<String> = ["alertname", "alertstate"]
            .into_iter()
            .map(String::from)
            .chain(external.keys().cloned())
            .chain(ignore.iter().cloned())
            .collect();
        Wanted {
            labels: without(labels, &dropped),
            dropped,
        }
    }

    /// `NAME{k="v",...}`, as a person reads the series.
    pub(crate) fn display(&self, name: &str) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={}", crate::prometheus::promql::string(v)))
            .collect();
        crate::text::one_line(&format!("{name}{{{}}}", labels.join(",")))
    }
}

fn without(
    labels: &BTreeMap<String, String>,
    dropped: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| !dropped.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rule(name: &str, query: &str, labels: &[(&str, &str)]) -> AlertRule {
        AlertRule {
            name: name.into(),
            query: query.into(),
            labels: map(labels),
            interval: Duration::from_secs(1),
            keep_firing_for: Duration::ZERO,
            group: "g".into(),
        }
    }

    fn sample(labels: &[(&str, &str)]) -> Sample {
        Sample {
            labels: map(labels),
            value: "1".into(),
        }
    }

    #[test]
    fn each_alert_is_checked_against_the_rule_whose_static_labels_it_carries() {
        let rules = [
            rule("QueueDeep", "q > 100", &[("severity", "page")]),
            rule("QueueDeep", "q > 10", &[("severity", "ticket")]),
            rule("Other", "x > 0", &[]),
        ];
        let page = map(&[
            ("alertname", "QueueDeep"),
            ("severity", "page"),
            ("queue", "a"),
        ]);
        let ticket = map(&[("alertname", "QueueDeep"), ("severity", "ticket")]);
        assert_eq!(rules_of(&rules, &page, None), vec![&rules[0]]);
        assert_eq!(rules_of(&rules, &ticket, None), vec![&rules[1]]);
        let unknown = map(&[("alertname", "Gone")]);
        assert!(rules_of(&rules, &unknown, None).is_empty());
    }

    #[test]
    fn the_generator_url_picks_between_rules_the_labels_cannot_tell_apart() {
        let rules = [
            rule("Deep", "q > 100", &[]),
            rule("Deep", "rate(q[5m]) > 1", &[]),
        ];
        let labels = map(&[("alertname", "Deep")]);
        assert_eq!(rules_of(&rules, &labels, None).len(), 2);
        assert_eq!(
            rules_of(&rules, &labels, Some("rate(q[5m])  >  1")),
            vec![&rules[1]]
        );
        let url = "http://prom:9090/graph?g0.expr=rate%28q%5B5m%5D%29+%3E+1&g0.tab=1";
        assert_eq!(generator_expr(url).as_deref(), Some("rate(q[5m]) > 1"));
        assert_eq!(generator_expr("not a url"), None);
    }

    #[test]
    fn a_templated_rule_label_matches_any_value_and_is_not_matched_on() {
        let rules = [rule(
            "Deep",
            "q > 1",
            &[("summary_host", "{{ $labels.instance }}")],
        )];
        let labels = map(&[
            ("alertname", "Deep"),
            ("summary_host", "web1"),
            ("instance", "web1"),
        ]);
        let found = rules_of(&rules, &labels, None);
        assert_eq!(found.len(), 1);
        let wanted = Wanted::of(&labels, &found[0].labels, &BTreeMap::new(), &[]);
        assert!(wanted.is(&sample(&[("instance", "web1")])));
    }

    #[test]
    fn static_and_external_labels_never_make_a_firing_series_look_cleared() {
        let alert = map(&[
            ("alertname", "Deep"),
            ("severity", "page"),
            ("cluster", "staging"),
            ("instance", "local"),
            ("queue", "orders"),
        ]);
        let wanted = Wanted::of(
            &alert,
            &map(&[("severity", "page")]),
            &map(&[("cluster", "staging")]),
            &[],
        );
        // The query's series: no severity, no cluster, a __name__.
        let firing = sample(&[
            ("__name__", "q"),
            ("instance", "local"),
            ("queue", "orders"),
        ]);
        assert!(wanted.is(&firing));
        // A series label the rule overwrote (severity) is matched on by neither side.
        let overwritten = sample(&[
            ("instance", "local"),
            ("queue", "orders"),
            ("severity", "low"),
        ]);
        assert!(wanted.is(&overwritten));
    }

    #[test]
    fn only_this_hosts_series_is_this_alert() {
        let alert = map(&[
            ("alertname", "Deep"),
            ("instance", "local"),
            ("queue", "orders"),
        ]);
        let wanted = Wanted::of(&alert, &BTreeMap::new(), &BTreeMap::new(), &[]);
        assert!(!wanted.is(&sample(&[("instance", "web2"), ("queue", "orders")])));
        assert!(!wanted.is(&sample(&[("instance", "local"), ("queue", "billing")])));
        assert!(!wanted.is(&sample(&[
            ("instance", "local"),
            ("queue", "orders"),
            ("extra", "1")
        ])));
        // A series with fewer labels may be this alert (relabelled): it
        // keeps it firing rather than let it pass for cleared.
        assert!(wanted.is(&sample(&[("instance", "local")])));
    }

    /// `alert_relabel_configs` added `region` to the alert; the rule's
    /// series never has it: the series is still found, and another
    /// region's value would not be.
    #[test]
    fn a_label_added_to_the_alert_alone_does_not_hide_its_series() {
        let alert = map(&[
            ("alertname", "Deep"),
            ("instance", "local"),
            ("region", "eu"),
        ]);
        let wanted = Wanted::of(&alert, &BTreeMap::new(), &BTreeMap::new(), &[]);
        assert!(wanted.is(&sample(&[("__name__", "q"), ("instance", "local")])));
        assert!(!wanted.is(&sample(&[("instance", "local"), ("region", "us")])));
    }

    /// In ALERTS the rule's static labels are there and matched on (two
    /// rules of one name are two alerts), `alertstate` and external labels
    /// are not.
    #[test]
    fn alerts_series_are_matched_with_their_static_labels() {
        let alert = map(&[
            ("alertname", "Deep"),
            ("severity", "page"),
            ("cluster", "staging"),
            ("instance", "local"),
        ]);
        let wanted = Wanted::in_alerts(&alert, &map(&[("cluster", "staging")]), &[]);
        let firing = |severity: &str| {
            sample(&[
                ("__name__", "ALERTS"),
                ("alertname", "Deep"),
                ("alertstate", "firing"),
                ("severity", severity),
                ("instance", "local"),
            ])
        };
        assert!(wanted.is(&firing("page")));
        assert!(!wanted.is(&firing("ticket")));
    }

    #[test]
    fn an_ignored_label_lets_a_replaced_process_still_count() {
        let alert = map(&[("alertname", "Deep"), ("instance", "local"), ("pid", "100")]);
        let wanted = Wanted::of(&alert, &BTreeMap::new(), &BTreeMap::new(), &["pid".into()]);
        assert!(wanted.is(&sample(&[("instance", "local"), ("pid", "200")])));
        assert_eq!(wanted.display("Deep"), r#"Deep{instance="local"}"#);
    }
}
