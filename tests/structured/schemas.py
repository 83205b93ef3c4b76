"""JSON schemas of increasing difficulty, each with a prompt that asks for it (shared by the offline and
server tests)."""

SCHEMAS: list[tuple[str, dict]] = [
    ("a number", {"type": "integer"}),
    ("yes or no", {"type": "boolean"}),
    ("a short word", {"type": "string", "maxLength": 12}),
    (
        "a person",
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]},
    ),
    (
        "a person with an age",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
            },
            "required": ["name", "age"],
        },
    ),
    (
        "a temperature",
        {
            "type": "object",
            "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}},
            "required": ["celsius"],
        },
    ),
    (
        "a color",
        {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"]}},
            "required": ["color"],
        },
    ),
    (
        "a list of fruits",
        {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 2, "maxItems": 3},
    ),
    (
        "three numbers",
        {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 3,
            "maxItems": 3,
        },
    ),
    (
        "a zip code",
        {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
        },
    ),
    (
        "an email",
        {
            "type": "object",
            "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
            "required": ["email"],
        },
    ),
    (
        "a book",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 30},
                "year": {"type": "integer", "minimum": 1500, "maximum": 2030},
                "isbn": {"type": "string", "maxLength": 13},
            },
            "required": ["title", "year"],
        },
    ),
    (
        "a point",
        {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    ),
    (
        "an address",
        {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 30},
                "city": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 20},
                        "country": {"enum": ["FR", "US", "DE"]},
                    },
                    "required": ["name", "country"],
                },
            },
            "required": ["street", "city"],
        },
    ),
    (
        "a team",
        {
            "type": "object",
            "properties": {
                "members": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 12},
                            "role": {"enum": ["lead", "dev"]},
                        },
                        "required": ["name", "role"],
                    },
                }
            },
            "required": ["members"],
        },
    ),
    (
        "a rating",
        {
            "type": "object",
            "properties": {
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                "comment": {"type": "string", "maxLength": 25},
            },
            "required": ["stars"],
        },
    ),
    (
        "a product with $defs",
        {
            "$defs": {
                "price": {
                    "type": "object",
                    "properties": {
                        "amount": {"type": "number", "minimum": 0, "maximum": 1000},
                        "currency": {"enum": ["EUR", "USD"]},
                    },
                    "required": ["amount", "currency"],
                }
            },
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "price": {"$ref": "#/$defs/price"}},
            "required": ["name", "price"],
        },
    ),
    (
        "a tree with $ref",
        {
            "$defs": {
                "leaf": {
                    "type": "object",
                    "properties": {"value": {"type": "integer"}},
                    "required": ["value"],
                }
            },
            "type": "object",
            "properties": {"left": {"$ref": "#/$defs/leaf"}, "right": {"$ref": "#/$defs/leaf"}},
            "required": ["left", "right"],
        },
    ),
    (
        "an event",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "day": {"type": "string", "pattern": "^2024-0[1-9]-[12][0-9]$"},
                "attendees": {"type": "integer", "minimum": 1, "maximum": 500},
            },
            "required": ["name", "day"],
        },
    ),
    ("either a number or a word", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}]}),
    (
        "a settings object",
        {
            "type": "object",
            "properties": {
                "theme": {"enum": ["dark", "light"]},
                "font_size": {"type": "integer", "minimum": 8, "maximum": 32},
                "beta": {"type": "boolean"},
                "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "maxItems": 3},
            },
            "required": ["theme", "font_size", "beta"],
        },
    ),
    (
        "an order",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "maxLength": 8},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                },
                "customer": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 16}, "vip": {"type": "boolean"}},
                    "required": ["name"],
                },
            },
            "required": ["id", "items", "customer"],
        },
    ),
]


def prompt_for(description: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Answer in JSON only: {description}."}]
