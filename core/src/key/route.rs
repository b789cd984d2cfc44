//! `RouteValue`: the value of a [`RouteKey`](super::RouteKey) (the matched route and its
//! path parameters), written one way for every framework.

/// The value of a route key: the
/// matched route's pattern, then `|name=value` for each chosen path parameter. `%` and `|`
/// are escaped (as `%25` and `%7C`) in the pattern and in each value, so that no parameter
/// value can pose as another parameter or another route: different routes and parameters
/// give different values.
///
/// ```text
/// let mut value = RouteValue::new("/tenants/{id}/jobs/{job}");
/// value.param("id", "7");
/// value.param("job", "a|job=9");
/// assert_eq!(value.into_string(), "/tenants/{id}/jobs/{job}|id=7|job=a%7Cjob=9");
/// ```
#[derive(Clone, Debug)]
pub(crate) struct RouteValue {
    text: String,
}

impl RouteValue {
    /// The value of `route`, the pattern the router matched, with no parameter yet.
    pub(crate) fn new(route: &str) -> Self {
        let mut text = String::with_capacity(route.len());
        escape_into(&mut text, route);
        Self { text }
    }

    /// Add the path parameter `name`, whose value is `value` (already percent-decoded, as
    /// the framework's path extractor decodes it, so that `/tenants/acm%65` and
    /// `/tenants/acme` lock the same key).
    pub(crate) fn param(&mut self, name: &str, value: &str) {
        self.text.push('|');
        self.text.push_str(name);
        self.text.push('=');
        escape_into(&mut self.text, value);
    }

    /// The value.
    pub(crate) fn into_string(self) -> String {
        self.text
    }
}

/// Append `part` with `%` and `|` percent-encoded.
fn escape_into(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_values_cannot_pose_as_another_parameter() {
        let mut one = RouteValue::new("/r/{a}");
        one.param("a", "x|b=y");
        let mut two = RouteValue::new("/r/{a}");
        two.param("a", "x");
        two.param("b", "y");
        assert_ne!(one.clone().into_string(), two.into_string());
        assert_eq!(one.into_string(), "/r/{a}|a=x%7Cb=y");
    }

    #[test]
    fn escapes_are_escaped_themselves() {
        let mut value = RouteValue::new("/%7C");
        value.param("id", "%7C");
        assert_eq!(value.into_string(), "/%257C|id=%257C");
    }
}
