//! The schemas of the protobuf messages the API reads and writes, from the
//! compiled descriptors, in proto3's JSON mapping as pbjson reads and
//! writes it (camelCase names, 64-bit integers as strings, enums by name),
//! with the proto's comments as their descriptions.

use std::collections::{BTreeMap, HashMap};

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type as Proto};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};
use serde_json::json;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type,
};

use super::{ROOTS, schema_ref};
use crate::pb::FILE_DESCRIPTOR_SET;

/// The schema of every message (and enum) the [`ROOTS`] hold, by full
/// proto name.
pub(super) struct MessageSchemas(pub(super) BTreeMap<String, RefOr<Schema>>);

/// A message or enum of the descriptor set, with the comments of its file.
enum Declared<'a> {
    Message(&'a DescriptorProto, Vec<i32>, &'a Comments),
    Enum(&'a EnumDescriptorProto, Vec<i32>, &'a Comments),
}

/// A file's leading comments, by the path of what they precede.
type Comments = HashMap<Vec<i32>, String>;

/// Descriptor paths: `FileDescriptorProto.message_type`, `enum_type`;
/// `DescriptorProto.field`, `nested_type`, `enum_type`;
/// `EnumDescriptorProto.value`.
const FILE_MESSAGES: i32 = 4;
const FILE_ENUMS: i32 = 5;
const MESSAGE_FIELDS: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUMS: i32 = 4;

impl MessageSchemas {
    pub(super) fn from_descriptors() -> Result<Self, String> {
        let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).map_err(|err| err.to_string())?;
        let comments: Vec<Comments> = set.file.iter().map(file_comments).collect();
        let mut declared = HashMap::new();
        for (file, comments) in set.file.iter().zip(&comments) {
            let package = file.package().to_owned();
            for (i, message) in file.message_type.iter().enumerate() {
                declare_message(
                    &mut declared,
                    &package,
                    message,
                    vec![FILE_MESSAGES, i as i32],
                    comments,
                );
            }
            for (i, kind) in file.enum_type.iter().enumerate() {
                declared.insert(
                    format!("{package}.{}", kind.name()),
                    Declared::Enum(kind, vec![FILE_ENUMS, i as i32], comments),
                );
            }
        }
        let mut schemas = BTreeMap::new();
        let mut pending: Vec<String> = ROOTS.iter().map(|root| (*root).to_owned()).collect();
        while let Some(name) = pending.pop() {
            if schemas.contains_key(&name) {
                continue;
            }
            let schema = match declared.get(&name) {
                Some(Declared::Message(message, path, comments)) => {
                    message_schema(message, path, comments, &declared, &mut pending)
                }
                Some(Declared::Enum(kind, path, comments)) => enum_schema(kind, path, comments),
                None => return Err(format!("{name} is not in the descriptors")),
            };
            schemas.insert(name, schema);
        }
        Ok(Self(schemas))
    }
}

fn declare_message<'a>(
    declared: &mut HashMap<String, Declared<'a>>,
    scope: &str,
    message: &'a DescriptorProto,
    path: Vec<i32>,
    comments: &'a Comments,
) {
    let name = format!("{scope}.{}", message.name());
    for (i, nested) in message.nested_type.iter().enumerate() {
        let mut nested_path = path.clone();
        nested_path.extend([MESSAGE_NESTED, i as i32]);
        declare_message(declared, &name, nested, nested_path, comments);
    }
    for (i, kind) in message.enum_type.iter().enumerate() {
        let mut enum_path = path.clone();
        enum_path.extend([MESSAGE_ENUMS, i as i32]);
        declared.insert(
            format!("{name}.{}", kind.name()),
            Declared::Enum(kind, enum_path, comments),
        );
    }
    declared.insert(name, Declared::Message(message, path, comments));
}

fn file_comments(file: &prost_types::FileDescriptorProto) -> Comments {
    let Some(info) = &file.source_code_info else {
        return Comments::new();
    };
    info.location
        .iter()
        .filter_map(|location| {
            let text = location.leading_comments.as_deref()?;
            let text = text
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_owned();
            (!text.is_empty()).then(|| (location.path.clone(), text))
        })
        .collect()
}

fn message_schema(
    message: &DescriptorProto,
    path: &[i32],
    comments: &Comments,
    declared: &HashMap<String, Declared<'_>>,
    pending: &mut Vec<String>,
) -> RefOr<Schema> {
    // A map field's entries: an object of values.
    let entries: HashMap<String, &DescriptorProto> = message
        .nested_type
        .iter()
        .filter(|nested| nested.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|nested| (nested.name().to_owned(), nested))
        .collect();
    let mut object = ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .description(comments.get(path).cloned());
    let mut oneofs: Vec<Vec<String>> = vec![Vec::new(); message.oneof_decl.len()];
    for (i, field) in message.field.iter().enumerate() {
        let mut field_path = path.to_vec();
        field_path.extend([MESSAGE_FIELDS, i as i32]);
        let json_name = field.json_name().to_owned();
        if let Some(index) = field.oneof_index
            && !field.proto3_optional()
            && let Some(members) = oneofs.get_mut(index as usize)
        {
            members.push(format!("`{json_name}`"));
        }
        let entry = field
            .type_name()
            .rsplit('.')
            .next()
            .and_then(|short| entries.get(short))
            .filter(|_| field.r#type() == Proto::Message);
        let schema = match entry {
            Some(entry) => {
                let value = entry.field.iter().find(|f| f.number() == 2);
                let value = value.map_or_else(
                    || RefOr::T(utoipa::openapi::schema::empty()),
                    |value| field_type(value, declared, pending),
                );
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(AdditionalProperties::RefOr(value)))
                    .into()
            }
            None if field.label() == Label::Repeated => ArrayBuilder::new()
                .items(field_type(field, declared, pending))
                .into(),
            None => field_type(field, declared, pending),
        };
        object = object.property(json_name, describe(schema, comments.get(&field_path)));
    }
    let groups: Vec<String> = message
        .oneof_decl
        .iter()
        .zip(&oneofs)
        .filter(|(_, members)| members.len() > 1)
        .map(|(oneof, members)| {
            format!(
                "At most one of {} (`{}`).",
                members.join(", "),
                oneof.name()
            )
        })
        .collect();
    if !groups.is_empty() {
        let mut text = comments.get(path).cloned().unwrap_or_default();
        for group in groups {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&group);
        }
        object = object.description(Some(text));
    }
    object.into()
}

/// `schema` with a field's comment as its description.
fn describe(schema: RefOr<Schema>, comment: Option<&String>) -> RefOr<Schema> {
    let Some(comment) = comment else {
        return schema;
    };
    match schema {
        RefOr::Ref(mut reference) => {
            reference.description = comment.clone();
            RefOr::Ref(reference)
        }
        RefOr::T(Schema::Object(mut object)) => {
            object.description = Some(comment.clone());
            RefOr::T(Schema::Object(object))
        }
        RefOr::T(Schema::Array(mut array)) => {
            array.description = Some(comment.clone());
            RefOr::T(Schema::Array(array))
        }
        other => other,
    }
}

fn enum_schema(kind: &EnumDescriptorProto, path: &[i32], comments: &Comments) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(kind.value.iter().map(|value| value.name().to_owned())))
        .description(comments.get(path).cloned())
        .into()
}

fn scalar(kind: Type, format: Option<&str>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(kind)
        .format(format.map(|format| SchemaFormat::Custom(format.to_owned())))
        .into()
}

/// A 64-bit integer: a string of digits when written, a number or such a
/// string when read.
fn wide_integer(format: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Integer]))
        .format(Some(SchemaFormat::Custom(format.to_owned())))
        .pattern(Some(if format.starts_with('u') {
            "^[0-9]+$"
        } else {
            "^-?[0-9]+$"
        }))
        .into()
}

/// One value of `field` (an item, for a repeated one).
fn field_type(
    field: &prost_types::FieldDescriptorProto,
    declared: &HashMap<String, Declared<'_>>,
    pending: &mut Vec<String>,
) -> RefOr<Schema> {
    match field.r#type() {
        Proto::Double | Proto::Float => scalar(Type::Number, None),
        Proto::Int64 | Proto::Sint64 | Proto::Sfixed64 => wide_integer("int64"),
        Proto::Uint64 | Proto::Fixed64 => wide_integer("uint64"),
        Proto::Int32 | Proto::Sint32 | Proto::Sfixed32 => scalar(Type::Integer, Some("int32")),
        Proto::Uint32 | Proto::Fixed32 => scalar(Type::Integer, Some("uint32")),
        Proto::Bool => scalar(Type::Boolean, None),
        Proto::String => scalar(Type::String, None),
        Proto::Bytes => ObjectBuilder::new()
            .schema_type(Type::String)
            .content_encoding("base64")
            .into(),
        Proto::Enum | Proto::Message | Proto::Group => {
            let name = field.type_name().trim_start_matches('.');
            if let Some(known) = well_known(name) {
                return known;
            }
            if declared.contains_key(name) {
                pending.push(name.to_owned());
            }
            schema_ref(name)
        }
    }
}

/// The well-known types, in their JSON mapping.
fn well_known(name: &str) -> Option<RefOr<Schema>> {
    Some(match name {
        "google.protobuf.Duration" => ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^-?[0-9]+(\.[0-9]{1,9})?s$"))
            .examples([json!("1.5s")])
            .into(),
        "google.protobuf.Timestamp" => ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("date-time".into())))
            .into(),
        "google.protobuf.Struct" | "google.protobuf.Any" | "google.protobuf.Empty" => {
            ObjectBuilder::new().schema_type(Type::Object).into()
        }
        "google.protobuf.ListValue" => ArrayBuilder::new().into(),
        "google.protobuf.Value" => RefOr::T(utoipa::openapi::schema::empty()),
        "google.protobuf.DoubleValue" | "google.protobuf.FloatValue" => scalar(Type::Number, None),
        "google.protobuf.Int64Value" => wide_integer("int64"),
        "google.protobuf.UInt64Value" => wide_integer("uint64"),
        "google.protobuf.Int32Value" => scalar(Type::Integer, Some("int32")),
        "google.protobuf.UInt32Value" => scalar(Type::Integer, Some("uint32")),
        "google.protobuf.BoolValue" => scalar(Type::Boolean, None),
        "google.protobuf.StringValue" => scalar(Type::String, None),
        "google.protobuf.BytesValue" => ObjectBuilder::new()
            .schema_type(Type::String)
            .content_encoding("base64")
            .into(),
        _ => return None,
    })
}
