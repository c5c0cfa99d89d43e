//! Checking a storm's ledger: every intended payment charged exactly once,
//! as planned, and as the clients were told.

use std::collections::HashMap;

use crate::ledger::Charge;
use crate::report::Report;
use crate::storm::Plan;

/// Compares the ledger with the plans and with the charge ids the clients
/// were told of.
pub(crate) fn check_ledger(
    report: &mut Report,
    run: &str,
    plans: &[Plan],
    seen: &[Vec<String>],
    charges: &[Charge],
) {
    let prefix = Plan::key_prefix(run);
    let mut by_key: HashMap<&str, Vec<&Charge>> = HashMap::new();
    for charge in charges
        .iter()
        .filter(|c| c.idempotency_key.starts_with(&prefix))
    {
        by_key
            .entry(&charge.idempotency_key)
            .or_default()
            .push(charge);
    }
    report.charged = by_key.values().map(Vec::len).sum();
    for (plan, seen) in plans.iter().zip(seen) {
        match by_key.remove(plan.key.as_str()).as_deref() {
            None | Some([]) => report.missing += 1,
            Some([charge]) => {
                let as_planned = charge.amount == plan.amount && charge.currency == plan.currency;
                let told_right = seen.iter().all(|id| *id == charge.id);
                if !(as_planned && told_right) {
                    report.wrong += 1;
                }
            }
            Some(_) => report.double_charged += 1,
        }
    }
    // Whatever is left was charged under a key of this run that no plan has.
    report.wrong += by_key.len();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Tally;
    use crate::storm::Plan;
    use std::time::Duration;

    fn plan(run: &str, index: usize) -> Plan {
        Plan::draw(1, run, index)
    }

    fn charge(plan: &Plan, id: &str) -> Charge {
        Charge {
            id: id.to_owned(),
            amount: plan.amount,
            currency: plan.currency.to_owned(),
            idempotency_key: plan.key.clone(),
            created_at: String::new(),
        }
    }

    fn check(plans: &[Plan], seen: &[Vec<String>], charges: &[Charge]) -> Report {
        let mut report = Tally::default().to_report(String::new(), plans.len(), Duration::ZERO);
        check_ledger(&mut report, "r", plans, seen, charges);
        report
    }

    #[test]
    fn the_ledger_check_counts_double_missing_and_wrong_charges() {
        let plans: Vec<Plan> = (0..5).map(|i| plan("r", i)).collect();
        let mut altered = charge(&plans[3], "ch_3");
        altered.amount += 1;
        let charges = [
            charge(&plans[0], "ch_0"),
            charge(&plans[1], "ch_1a"),
            charge(&plans[1], "ch_1b"),
            // plans[2] is never charged.
            altered,
            charge(&plans[4], "ch_4"),
            charge(&plan("r", 99), "ch_99"),
            // Another run's charges are not this storm's business.
            charge(&plan("other", 0), "ch_x"),
        ];
        let seen = [
            vec!["ch_0".to_owned()],
            vec![],
            vec![],
            vec![],
            // The client was told of a charge the ledger does not hold.
            vec!["ch_4".to_owned(), "ch_elsewhere".to_owned()],
        ];
        let report = check(&plans, &seen, &charges);
        assert_eq!(report.charged, 6);
        assert_eq!(report.double_charged, 1);
        assert_eq!(report.missing, 1);
        // The altered charge, the misreported one and the unplanned key.
        assert_eq!(report.wrong, 3);
        assert!(!report.passed());
    }

    #[test]
    fn a_ledger_with_one_charge_per_payment_passes() {
        let plans: Vec<Plan> = (0..3).map(|i| plan("r", i)).collect();
        let charges: Vec<Charge> = plans.iter().map(|p| charge(p, &p.key)).collect();
        let seen: Vec<Vec<String>> = plans.iter().map(|p| vec![p.key.clone()]).collect();
        let report = check(&plans, &seen, &charges);
        assert_eq!((report.charged, report.missing, report.wrong), (3, 0, 0));
        assert!(report.passed());
    }
}
